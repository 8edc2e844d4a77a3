//! Draining one rank's SUB socket: every queued message is received into reused `zmq::Message`s,
//! its frames checked and its seq accounted (so gaps and restarts are counted exactly), but only
//! the newest payload is decoded and applied to the book — a backlog costs one decode, not one per
//! message. The drain ends at `EAGAIN` *and* a `ZMQ_EVENTS` without `POLLIN`: `ZMQ_FD` is
//! edge-triggered, so stopping earlier could leave messages that no later edge announces. The one
//! exception is the per-wakeup budget ([`drain_rank_at_most`]): a drain stopped by it says so
//! ([`Drained::more`]) and its caller must come back to the socket without waiting for an edge.

use super::stats::IngestStats;
use crate::book::{SeqEvent, Worker};
use loadlink_wire::codec::{decode_payload, decode_snapshot_into};
use loadlink_wire::frame::split_frames;
use loadlink_wire::{FrameError, LoadSnapshot};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

/// Buffers one ingest thread reuses for every drain.
pub struct Scratch {
    frames: [zmq::Message; 3],
    newest: zmq::Message,
    snap: LoadSnapshot,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            frames: [
                zmq::Message::new(),
                zmq::Message::new(),
                zmq::Message::new(),
            ],
            newest: zmq::Message::new(),
            snap: LoadSnapshot::default(),
        }
    }
}

/// What one drain did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Messages received (valid or not).
    pub messages: u64,
    /// Payloads decoded: 0 or 1.
    pub decoded: u64,
    /// Stopped at its message budget with messages possibly left: no edge will announce them.
    pub more: bool,
}

/// Receives one multipart message into `frames`; returns its frame count (frames past the third
/// are received into the last slot and discarded).
fn recv_message(s: &zmq::Socket, frames: &mut [zmq::Message; 3]) -> zmq::Result<usize> {
    s.recv(&mut frames[0], zmq::DONTWAIT)?;
    let mut n = 1;
    while frames[(n - 1).min(2)].get_more() {
        // The remaining parts of a multipart message are delivered with its first.
        s.recv(&mut frames[n.min(2)], zmq::DONTWAIT)?;
        n += 1;
    }
    Ok(n)
}

/// Whether libzmq has more for `s` (this also lets it process pending commands). Every drain of
/// the ingest (load, KV live, KV replay) ends only when this is false.
pub(crate) fn readable(s: &zmq::Socket) -> bool {
    s.get_events().is_ok_and(|e| e.contains(zmq::POLLIN))
}

/// Drains `socket` (rank `rank` of `worker`) as described in the module docs.
pub fn drain_rank(
    socket: &zmq::Socket,
    worker: &Worker,
    rank: usize,
    scratch: &mut Scratch,
    stats: &IngestStats,
) -> Drained {
    drain_rank_at_most(socket, worker, rank, scratch, stats, u64::MAX)
}

/// [`drain_rank`] receiving at most `limit` messages; [`Drained::more`] when it stopped there.
pub fn drain_rank_at_most(
    socket: &zmq::Socket,
    worker: &Worker,
    rank: usize,
    scratch: &mut Scratch,
    stats: &IngestStats,
    limit: u64,
) -> Drained {
    let mut out = Drained::default();
    let mut have_newest = false;
    loop {
        if out.messages >= limit {
            out.more = true;
            break;
        }
        match recv_message(socket, &mut scratch.frames) {
            Ok(n) => {
                out.messages += 1;
                if let Some(seq) = check(&scratch.frames, n, worker) {
                    if worker.account_seq(rank, seq) == SeqEvent::Restart {
                        tracing::info!(worker = %worker.url, rank, "load publisher restarted (seq went back to {seq})");
                    }
                    std::mem::swap(&mut scratch.frames[2], &mut scratch.newest);
                    have_newest = true;
                }
            }
            Err(zmq::Error::EAGAIN) if readable(socket) => continue,
            Err(_) => break,
        }
    }
    if have_newest && apply_newest(worker, rank, scratch, stats) {
        out.decoded = 1;
    }
    stats.messages.fetch_add(out.messages, Relaxed);
    stats.decoded.fetch_add(out.decoded, Relaxed);
    out
}

/// The seq of a well-formed message, or `None` after counting why it was dropped.
fn check(frames: &[zmq::Message; 3], n: usize, worker: &Worker) -> Option<i64> {
    if n != 3 {
        worker.drop_frame(&FrameError::FrameCount(n));
        return None;
    }
    let parts: [&[u8]; 3] = [&frames[0], &frames[1], &frames[2]];
    match split_frames(&parts) {
        Ok(raw) => Some(raw.seq),
        Err(e) => {
            worker.drop_frame(&e);
            None
        }
    }
}

/// Decodes the newest payload into the reused snapshot and records it; false if it is malformed.
fn apply_newest(worker: &Worker, rank: usize, scratch: &mut Scratch, stats: &IngestStats) -> bool {
    let bytes: &[u8] = &scratch.newest;
    // A map is a generation-A snapshot (decoded in place, reusing its allocations); anything else
    // goes through the generic decoder (generation B's small stat array).
    let decoded = if matches!(bytes.first(), Some(0x80..=0x8f | 0xde | 0xdf)) {
        decode_snapshot_into(bytes, &mut scratch.snap)
    } else {
        decode_payload(bytes).map(|p| scratch.snap = p.into_snapshot())
    };
    if let Err(e) = decoded {
        worker.drop_frame(&FrameError::Payload(e));
        return false;
    }
    worker.apply_at(rank, &scratch.snap, worker.now_ms());
    let ts = scratch.snap.timestamp();
    if ts > 0.0 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        stats.observe_lag(now - ts);
    }
    true
}
