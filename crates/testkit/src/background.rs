//! A second runtime for the parts of a test that must not share the router's: a test that puts
//! the router on a current-thread runtime (to see whether anything blocks it) runs its workers
//! and its clients here, so their own work cannot be mistaken for the router's.

use axum::body::Bytes;
use reqwest::Client;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// A multi-thread runtime on its own threads, shut down (without waiting) when dropped.
pub struct Background {
    rt: Option<tokio::runtime::Runtime>,
}

impl Default for Background {
    fn default() -> Self {
        Background::new()
    }
}

impl Background {
    pub fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a background runtime");
        Background { rt: Some(rt) }
    }

    /// Runs `f` on the background runtime; the handle may be awaited from any runtime.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.as_ref().expect("running").spawn(f)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Clients that POST the same body again and again until stopped, counting the answers.
pub struct Flood {
    /// Answers with status 200.
    pub ok: Arc<AtomicU64>,
    /// Other answers and transport errors.
    pub other: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Flood {
    /// `concurrency` loops on `bg`, each POSTing `body` (JSON) to `url` until [`Flood::stop`].
    pub fn start(bg: &Background, url: String, body: Vec<u8>, concurrency: usize) -> Flood {
        let flood = Flood {
            ok: Arc::default(),
            other: Arc::default(),
            stop: Arc::default(),
        };
        let body = Bytes::from(body);
        for _ in 0..concurrency {
            let (ok, other, stop) = (flood.ok.clone(), flood.other.clone(), flood.stop.clone());
            let (url, body, c) = (url.clone(), body.clone(), Client::new());
            bg.spawn(async move {
                while !stop.load(Relaxed) {
                    let sent = c
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status() == 200 => ok.fetch_add(1, Relaxed),
                        _ => other.fetch_add(1, Relaxed),
                    };
                }
            });
        }
        flood
    }

    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop();
    }
}
