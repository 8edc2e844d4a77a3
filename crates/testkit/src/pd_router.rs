//! A PD fleet's engines as a router test needs to see them: loopback HTTP servers that advertise
//! a `disaggregation_mode` and bootstrap port in `/server_info`, record every generation body
//! they receive (so a test can check each room's two legs), and answer as told — normally, with an
//! error status, slowly, or with a stream cut after its first event (an engine killed mid-answer).
//! They move no KV: what they check is the router's side of the contract; the engines' side is
//! tested with real PD engines.

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a capture engine answers a generation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// At once: a JSON body, or a short SSE stream.
    Normal,
    /// This status, in SGLang's error shape.
    Status(u16),
    /// SSE: `events` events `every_ms` apart (JSON: after that long).
    Slow { events: u32, every_ms: u64 },
    /// SSE: one event, then the connection is cut (JSON: the body is cut).
    Cut,
}

/// A capture engine: its URL, role, advertised bootstrap port and the bodies it received.
#[derive(Clone)]
pub struct CaptureEngine {
    pub url: String,
    pub mode: &'static str,
    pub bootstrap_port: u16,
    pub bodies: Arc<Mutex<Vec<Value>>>,
}

impl CaptureEngine {
    /// The bodies received so far.
    pub fn received(&self) -> Vec<Value> {
        self.bodies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Starts a capture engine in `mode` ("prefill", "decode" or "null") advertising
/// `bootstrap_port`, answering every generation request as `answer`. It speaks HTTP/1.1 over a
/// loopback socket itself (one request per connection), so it can cut a stream as a killed
/// engine does.
pub async fn capture_engine(
    mode: &'static str,
    bootstrap_port: u16,
    answer: Answer,
) -> CaptureEngine {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("bound address"));
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let info = json!({
        "disaggregation_mode": mode,
        "disaggregation_bootstrap_port": if mode == "prefill" { json!(bootstrap_port) } else { Value::Null },
    });
    let seen = bodies.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (info, seen) = (info.clone(), seen.clone());
            tokio::spawn(async move {
                let _ = serve(sock, mode, answer, &info, &seen).await;
            });
        }
    });
    CaptureEngine {
        url,
        mode,
        bootstrap_port,
        bodies,
    }
}

/// Largest request head or body a capture engine reads.
const MAX_REQUEST: usize = 1 << 20;

async fn serve(
    mut sock: TcpStream,
    mode: &'static str,
    answer: Answer,
    info: &Value,
    seen: &Mutex<Vec<Value>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = sock.read(&mut chunk).await?;
        if n == 0 || buf.len() > MAX_REQUEST {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0)
        .min(MAX_REQUEST);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[head_end..head_end + length];
    match path.as_str() {
        "/server_info" | "/get_server_info" => return write_json(&mut sock, 200, info).await,
        "/generate" | "/v1/completions" | "/v1/chat/completions" => {}
        _ => return write_json(&mut sock, 200, &json!("ok")).await,
    }
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let stream = v["stream"].as_bool().unwrap_or(false);
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(v);
    let done = json!({"text": "ok", "role": mode});
    match (answer, stream) {
        (Answer::Status(s), _) => {
            let msg = format!("{mode} engine answered {s} as told");
            write_json(
                &mut sock,
                s,
                &json!({"object": "error", "message": msg, "code": s}),
            )
            .await
        }
        (Answer::Normal, false) => write_json(&mut sock, 200, &done).await,
        (Answer::Slow { events, every_ms }, false) => {
            tokio::time::sleep(Duration::from_millis(every_ms * u64::from(events))).await;
            write_json(&mut sock, 200, &done).await
        }
        (Answer::Cut, false) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"text\":";
            sock.write_all(head.as_bytes()).await
        }
        (a, true) => {
            let (events, every_ms) = match a {
                Answer::Slow { events, every_ms } => (events, every_ms),
                Answer::Cut => (1, 0),
                _ => (3, 0),
            };
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            sock.write_all(head.as_bytes()).await?;
            for i in 0..events {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(every_ms)).await;
                }
                let event = format!("data: {}\n\n", json!({"text": format!("{mode}-{i}")}));
                write_chunk(&mut sock, &event).await?;
            }
            if a == Answer::Cut {
                return Ok(()); // dropped without the last chunk: a cut stream
            }
            write_chunk(&mut sock, "data: [DONE]\n\n").await?;
            sock.write_all(b"0\r\n\r\n").await
        }
    }
}

async fn write_chunk(sock: &mut TcpStream, data: &str) -> std::io::Result<()> {
    sock.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
        .await?;
    sock.flush().await
}

async fn write_json(sock: &mut TcpStream, status: u16, v: &Value) -> std::io::Result<()> {
    let body = v.to_string();
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}

/// A URL on which nothing listens (a port bound, then released).
pub async fn refusing_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", l.local_addr().expect("address"));
    drop(l);
    url
}

/// The bootstrap fields of a captured body: host, port, room (single requests).
pub fn bootstrap_of(v: &Value) -> (Option<String>, Option<u64>, Option<u64>) {
    (
        v["bootstrap_host"].as_str().map(String::from),
        v["bootstrap_port"].as_u64(),
        v["bootstrap_room"].as_u64(),
    )
}
