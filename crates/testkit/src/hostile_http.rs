//! A hostile HTTP worker: a raw TCP server on loopback that answers each path however a test (or
//! a soak) wants, including the ways a well-behaved HTTP library would never produce: headers
//! then silence, a body dribbled one byte at a time, a body far beyond any budget, a
//! `Content-Length` that lies. It counts the requests per path, so a test can assert how many
//! times the router asked.
//!
//! Unconfigured paths answer 404; `/health` answers 200 until told otherwise. Every connection
//! is closed after its answer (`Connection: close`), so each request is one connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the worker answers one path.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete answer.
    Full {
        status: u16,
        content_type: String,
        body: Vec<u8>,
    },
    /// Headers announcing `declared` body bytes, then nothing until the peer hangs up.
    StallAfterHeaders { declared: usize },
    /// `body`, one byte every `every`.
    Dribble { body: Vec<u8>, every: Duration },
    /// A 200 with `bytes` of body (sent as fast as the peer reads; `declared` says whether the
    /// length is announced in `Content-Length` or only discovered by reading to the end).
    Oversized { bytes: usize, declared: bool },
}

impl Reply {
    /// A 200 with a JSON body.
    pub fn json(v: &serde_json::Value) -> Reply {
        Reply::Full {
            status: 200,
            content_type: "application/json".into(),
            body: v.to_string().into_bytes(),
        }
    }

    /// A 200 with a text body (e.g. a `/metrics` page).
    pub fn text(t: &str) -> Reply {
        Reply::Full {
            status: 200,
            content_type: "text/plain; version=0.0.4".into(),
            body: t.as_bytes().to_vec(),
        }
    }

    /// `status` with an empty body.
    pub fn status(status: u16) -> Reply {
        Reply::Full {
            status,
            content_type: "text/plain".into(),
            body: Vec::new(),
        }
    }
}

#[derive(Default)]
struct Shared {
    replies: HashMap<String, Reply>,
    hits: HashMap<String, u64>,
}

/// A running hostile worker; it serves until the test's runtime ends.
#[derive(Clone)]
pub struct HostileWorker {
    url: String,
    shared: Arc<Mutex<Shared>>,
}

impl HostileWorker {
    /// Starts one on a free loopback port.
    pub async fn start() -> HostileWorker {
        HostileWorker::start_at("127.0.0.1:0").await
    }

    /// Starts one listening on `addr` (e.g. `127.0.0.5:PORT`, to stand behind a DNS record).
    pub async fn start_at(addr: &str) -> HostileWorker {
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        let url = format!("http://{}", listener.local_addr().expect("bound address"));
        let shared = Arc::new(Mutex::new(Shared::default()));
        shared
            .lock()
            .unwrap()
            .replies
            .insert("/health".into(), Reply::text("ok"));
        let s = shared.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, s.clone()));
            }
        });
        HostileWorker { url, shared }
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Answers `path` (without query) with `reply` from now on; returns `self` for chaining.
    pub fn on(&self, path: &str, reply: Reply) -> &Self {
        self.shared
            .lock()
            .unwrap()
            .replies
            .insert(path.into(), reply);
        self
    }

    /// Requests received for `path` (without query) so far.
    pub fn hits(&self, path: &str) -> u64 {
        self.shared
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

/// The path of a request head (`GET /p?q HTTP/1.1` → `/p`).
fn path_of(head: &[u8]) -> String {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let target = line.split(|b| *b == b' ').nth(1).unwrap_or_default();
    let target = String::from_utf8_lossy(target);
    target.split('?').next().unwrap_or_default().to_string()
}

/// Reads one request head (up to 64 KiB); `None` if the peer sent none.
async fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.ok()?;
        if n == 0 || head.len() > 64 << 10 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Some(head)
}

fn head(status: u16, content_type: &str, length: Option<usize>) -> Vec<u8> {
    let length = length.map_or(String::new(), |n| format!("content-length: {n}\r\n"));
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n{length}connection: close\r\n\r\n"
    )
    .into_bytes()
}

async fn serve(mut conn: TcpStream, shared: Arc<Mutex<Shared>>) {
    let Some(request) = read_head(&mut conn).await else {
        return;
    };
    let path = path_of(&request);
    let reply = {
        let mut s = shared.lock().unwrap();
        *s.hits.entry(path.clone()).or_default() += 1;
        s.replies.get(&path).cloned()
    };
    let reply = reply.unwrap_or(Reply::status(404));
    let _ = answer(&mut conn, reply).await;
}

async fn answer(conn: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    match reply {
        Reply::Full {
            status,
            content_type,
            body,
        } => {
            conn.write_all(&head(status, &content_type, Some(body.len())))
                .await?;
            conn.write_all(&body).await?;
        }
        Reply::StallAfterHeaders { declared } => {
            conn.write_all(&head(200, "application/json", Some(declared)))
                .await?;
            conn.write_all(b"{").await?;
            // Hold the connection until the peer gives up on it.
            let mut buf = [0u8; 256];
            while conn.read(&mut buf).await? > 0 {}
        }
        Reply::Dribble { body, every } => {
            conn.write_all(&head(200, "application/json", Some(body.len())))
                .await?;
            for b in body {
                conn.write_all(&[b]).await?;
                tokio::time::sleep(every).await;
            }
        }
        Reply::Oversized { bytes, declared } => {
            conn.write_all(&head(200, "application/json", declared.then_some(bytes)))
                .await?;
            let chunk = vec![b' '; 64 << 10];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                conn.write_all(&chunk[..n]).await?;
                left -= n;
            }
        }
    }
    conn.shutdown().await
}
