//! One subscriber thread per worker: a libzmq SUB per DP rank, decoded with `loadlink-wire` and
//! recorded in the worker's `LoadBook` entry. Malformed frames are dropped and counted by reason;
//! sequence gaps and restarts are counted by the book. The thread stops when its flag is cleared
//! (worker removed) and never touches the request path.

use crate::book::{SeqEvent, Worker};
use loadlink_wire::FrameError;
use loadlink_wire::descriptor::LoadEndpoint;
use loadlink_wire::frame::{Message, decode_frames};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Largest accepted message; libzmq drops the connection of a peer that sends more.
pub const MAX_MSG_BYTES: i64 = 1 << 20;

/// A running subscription; stops its thread when dropped.
pub struct Subscription {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A SUB socket dialing `endpoint` for `topic` (empty: every topic), with the router's bounds:
/// message size, reconnect backoff, keepalive, receive high-water mark, no linger.
pub fn open(ctx: &zmq::Context, endpoint: &str, topic: &[u8]) -> zmq::Result<zmq::Socket> {
    let s = ctx.socket(zmq::SUB)?;
    s.set_ipv6(endpoint.contains('['))?;
    s.set_maxmsgsize(MAX_MSG_BYTES)?;
    s.set_reconnect_ivl(100)?;
    s.set_reconnect_ivl_max(5000)?;
    s.set_tcp_keepalive(1)?;
    s.set_tcp_keepalive_idle(30)?;
    s.set_rcvhwm(1000)?;
    s.set_linger(0)?;
    s.set_subscribe(topic)?;
    s.connect(endpoint)?;
    Ok(s)
}

/// Waits up to `timeout_ms` for messages; says which of `sockets` are readable.
pub fn wait_readable<'a>(
    sockets: impl IntoIterator<Item = &'a zmq::Socket>,
    timeout_ms: i64,
) -> zmq::Result<Vec<bool>> {
    let mut items: Vec<zmq::PollItem> = sockets
        .into_iter()
        .map(|s| s.as_poll_item(zmq::POLLIN))
        .collect();
    zmq::poll(&mut items, timeout_ms)?;
    Ok(items.iter().map(zmq::PollItem::is_readable).collect())
}

/// Decodes every message queued on `socket`, oldest first, without blocking.
pub fn drain(socket: &zmq::Socket, mut each: impl FnMut(Result<Message, FrameError>)) {
    while let Ok(frames) = socket.recv_multipart(zmq::DONTWAIT) {
        each(decode_frames(&frames));
    }
}

/// Subscribes to every rank of `worker` (endpoint i ↔ rank `endpoints[i].rank`).
pub fn subscribe(
    ctx: &zmq::Context,
    worker: Arc<Worker>,
    endpoints: Vec<LoadEndpoint>,
) -> zmq::Result<Subscription> {
    let sockets: Vec<(usize, zmq::Socket)> = endpoints
        .iter()
        .map(|ep| {
            Ok((
                ep.rank as usize,
                open(ctx, &ep.endpoint, ep.generation.topic())?,
            ))
        })
        .collect::<zmq::Result<_>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let name = format!("sub-{}", worker.url);
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || run(worker, sockets, stop2))
        .map_err(|_| zmq::Error::EMFILE)?;
    Ok(Subscription {
        stop,
        thread: Some(thread),
    })
}

fn run(worker: Arc<Worker>, sockets: Vec<(usize, zmq::Socket)>, stop: Arc<AtomicBool>) {
    let poll_ms = Duration::from_millis(100).as_millis() as i64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(ready) = wait_readable(sockets.iter().map(|(_, s)| s), poll_ms) else {
            continue;
        };
        for ((rank, s), ready) in sockets.iter().zip(ready) {
            if ready {
                drain(s, |m| record(&worker, *rank, m));
            }
        }
    }
}

/// Records one decoded message in the book, or counts its drop.
fn record(worker: &Worker, rank: usize, m: Result<Message, FrameError>) {
    match m {
        Ok(m) => {
            let snap = m.payload.into_snapshot();
            if worker.record(rank, m.seq, &snap) == SeqEvent::Restart {
                tracing::info!(worker = %worker.url, rank, "load publisher restarted (seq went back to {})", m.seq);
            }
        }
        Err(e) => worker.drop_frame(&e),
    }
}
