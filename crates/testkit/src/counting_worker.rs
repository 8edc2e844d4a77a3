//! A worker that counts the requests it holds at once, remembers the most it ever held, and
//! publishes that count as its load (`num_running_reqs`, every 2 ms). A cap on what a worker
//! holds is then checked where it matters, at the worker, and exactly: a request counts from its
//! arrival until just before its answer is sent, so the router always releases a request after
//! the worker stopped counting it.

use crate::kv::advertised;
use crate::pub_sink::snapshot_pub;
use crate::router::{serve_loopback, server_info_app};
use axum::routing::post;
use loadlink_publish::{Encoded, Sink, free_port_block};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::time::Duration;

/// The worker: its URL, what it holds now and the most it held. Its publisher stops on drop.
pub struct CountingWorker {
    pub url: String,
    pub open: Arc<AtomicI64>,
    pub peak: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
}

impl Drop for CountingWorker {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// One held request; leaving (answered or cancelled) stops counting it.
struct Held(Arc<AtomicI64>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Starts a worker that holds each completion for `hold` before answering it.
pub async fn counting_worker(hold: Duration) -> CountingWorker {
    let load_port = free_port_block(1).expect("a free load port");
    let (open, peak, stop) = (
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (o, p) = (open.clone(), peak.clone());
    let info = json!({ "dp_size": 1, "kv_events": advertised(load_port) });
    let app = server_info_app(info).route(
        "/v1/completions",
        post(move || {
            let (open, peak) = (o.clone(), p.clone());
            async move {
                let now = open.fetch_add(1, Relaxed) + 1;
                peak.fetch_max(now, Relaxed);
                let held = Held(open);
                tokio::time::sleep(hold).await;
                drop(held);
                axum::Json(json!({ "choices": [{ "text": "ok" }] }))
            }
        }),
    );
    let url = serve_loopback(app).await;
    let (o, s) = (open.clone(), stop.clone());
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let mut sink = snapshot_pub(&ctx, load_port).expect("the load port binds");
        while !s.load(Relaxed) {
            let snap = LoadSnapshot {
                num_running_reqs: o.load(Relaxed),
                ..Default::default()
            };
            let _ = sink.write(Encoded {
                snapshot: &snap,
                bytes: &snapshot_bytes(&snap),
            });
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    CountingWorker {
        url,
        open,
        peak,
        stop,
    }
}
