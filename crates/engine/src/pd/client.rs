//! The decode side's bootstrap client: one pooled TCP connection per prefill address, the rooms
//! waiting on each, and what ends their wait (`transferred`, `failed`, or the connection's loss,
//! which fails every room waiting on it).
//!
//! Budgets: at most [`MAX_WAITING`] rooms wait on one connection, dialing gives up after the
//! caller's timeout, frames are bounded by [`super::frame::MAX_FRAME`]; a malformed frame from a
//! prefill engine closes that connection (failing its rooms) and the next request dials anew.

use super::frame::{Frame, read_frame};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

/// Rooms waiting on one connection at most.
pub const MAX_WAITING: usize = 16_384;

/// A room's KV arrived: its prompt tokens and bytes, as the prefill side reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrived {
    pub(crate) tokens: u64,
    pub(crate) bytes: u64,
}

type Waiter = oneshot::Sender<Result<Arrived, String>>;

struct Conn {
    addr: String,
    frames: UnboundedSender<Frame>,
    waiting: Mutex<HashMap<u64, Waiter>>,
    alive: AtomicBool,
    /// Wakes the writer when the connection is lost, so its task ends.
    closed: tokio::sync::Notify,
}

impl Conn {
    /// Fails every room waiting on this connection.
    fn fail_all(&self, reason: &str) {
        self.alive.store(false, Ordering::Relaxed);
        self.closed.notify_one();
        let waiting = self
            .waiting
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        for (_, w) in waiting {
            let _ = w.send(Err(reason.to_string()));
        }
    }

    fn settle(&self, room: u64, outcome: Result<Arrived, String>) {
        let w = self.waiting.lock().ok().and_then(|mut w| w.remove(&room));
        if let Some(w) = w {
            let _ = w.send(outcome);
        }
    }
}

/// The decode side's connections, by prefill address.
#[derive(Default)]
pub(crate) struct Bootstrap {
    conns: Mutex<HashMap<String, Arc<Conn>>>,
}

impl Bootstrap {
    /// Rooms waiting for their KV, over every connection.
    pub(crate) fn waiting(&self) -> usize {
        self.conns.lock().map_or(0, |c| {
            c.values()
                .map(|c| c.waiting.lock().map_or(0, |w| w.len()))
                .sum()
        })
    }

    /// Registers `room` with the prefill engine at `addr` (`host:port`) and waits until its KV
    /// has arrived. Errors say why it will not (the caller bounds the wait).
    pub(crate) async fn await_kv(
        &self,
        addr: &str,
        room: u64,
        dp_rank: i32,
    ) -> Result<Arrived, String> {
        let conn = self.connection(addr).await?;
        let (tx, rx) = oneshot::channel();
        {
            let mut w = conn.waiting.lock().map_err(|_| "waiting table poisoned")?;
            if w.len() >= MAX_WAITING {
                return Err(format!(
                    "too many rooms waiting on the bootstrap connection to {addr} (at most {MAX_WAITING})"
                ));
            }
            if w.contains_key(&room) {
                return Err(format!(
                    "bootstrap_room {room} is already waiting for its KV here"
                ));
            }
            w.insert(room, tx);
        }
        if conn.frames.send(Frame::Register { room, dp_rank }).is_err() {
            self.forget(addr, room);
            return Err(format!("the bootstrap connection to {addr} closed"));
        }
        rx.await
            .unwrap_or_else(|_| Err(format!("the bootstrap connection to {addr} closed")))
    }

    /// Stops waiting for `room` (its request timed out or went away).
    pub(crate) fn forget(&self, addr: &str, room: u64) {
        let conn = self.conns.lock().ok().and_then(|c| c.get(addr).cloned());
        if let Some(c) = conn
            && let Ok(mut w) = c.waiting.lock()
        {
            w.remove(&room);
        }
    }

    /// The live connection to `addr`, dialed if there is none.
    async fn connection(&self, addr: &str) -> Result<Arc<Conn>, String> {
        let existing = self.conns.lock().ok().and_then(|c| c.get(addr).cloned());
        if let Some(c) = existing.filter(|c| c.alive.load(Ordering::Relaxed)) {
            return Ok(c);
        }
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dialing the prefill engine's bootstrap server {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Frame>();
        let conn = Arc::new(Conn {
            addr: addr.to_string(),
            frames: tx,
            waiting: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            closed: tokio::sync::Notify::new(),
        });
        // Another request may have dialed meanwhile: keep the first live connection.
        {
            let mut conns = self.conns.lock().map_err(|_| "connection pool poisoned")?;
            if let Some(c) = conns.get(addr).filter(|c| c.alive.load(Ordering::Relaxed)) {
                return Ok(c.clone());
            }
            conns.insert(addr.to_string(), conn.clone());
        }
        let writer_conn = conn.clone();
        tokio::spawn(async move {
            loop {
                let f = tokio::select! {
                    f = rx.recv() => f,
                    () = writer_conn.closed.notified() => None,
                };
                let Some(f) = f else {
                    return;
                };
                if wr.write_all(&f.encode()).await.is_err() {
                    writer_conn.fail_all(&format!(
                        "the bootstrap connection to {} failed while registering",
                        writer_conn.addr
                    ));
                    return;
                }
            }
        });
        let reader_conn = Arc::downgrade(&conn);
        tokio::spawn(async move {
            let reason = loop {
                let frame = read_frame(&mut rd).await;
                let Some(c) = reader_conn.upgrade() else {
                    return;
                };
                match frame {
                    Ok(Some(Frame::Transferred {
                        room,
                        tokens,
                        bytes,
                    })) => c.settle(room, Ok(Arrived { tokens, bytes })),
                    Ok(Some(Frame::Failed { room, reason })) => c.settle(
                        room,
                        Err(format!("the prefill engine failed the room: {reason}")),
                    ),
                    Ok(Some(other)) => break format!("the prefill engine sent {other:?}"),
                    Ok(None) => break "the prefill engine closed the connection".to_string(),
                    Err(e) => break e.to_string(),
                }
            };
            if let Some(c) = reader_conn.upgrade() {
                c.fail_all(&format!(
                    "bootstrap connection to {} lost before the KV arrived: {reason}",
                    c.addr
                ));
            }
        });
        Ok(conn)
    }
}
