//! The replay ROUTER of one rank, on its own thread, and the buffer it shares with the publishing
//! thread.
//!
//! Why a second thread: a replay of thousands of batches, or a snapshot of a large cache, takes
//! time. Served on the publishing thread it would hold back the live stream (and so the queue,
//! which then drops). The publishing thread now only pushes `(seq, payload)` into a bounded
//! [`ReplayBuffer`] (a short lock, an `Arc` clone, no copy) and never reads the ROUTER.
//!
//! Requests, told apart by the frame after the empty delimiter:
//! * `[id, b"", 8-byte BE start seq]`: every buffered batch from that seq as
//!   `[id, b"", topic, seq, payload]`, then the end marker `[id, b"", b"", -1, b""]` (SGLang's
//!   replay, byte for byte);
//! * `[id, b"", b"snapshot-v1"]`: `[id, b"", kind, payload]` replies (header, chunks, end), or one
//!   `error` when the rank has no snapshot source or the source failed. Snapshot requests drained
//!   in one wake-up share one cut.
//!
//! Anything else is counted in `errors` and not answered (as SGLang 0.5.23 does).

use crate::kv_cut::{SnapshotSource, snapshot_replies};
use crate::kv_publisher::{KvPublisherStats, TopicFrame};
use loadlink_wire::frame::seq_frame;
use loadlink_wire::kv_snapshot::{KIND_ERROR, SNAPSHOT_REQUEST, encode_error};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How long the replay thread waits on its socket before it checks for shutdown.
const POLL_MS: i64 = 50;

/// The last `capacity` published batches, oldest first, seqs increasing (holes where a batch was
/// dropped before publishing).
pub(crate) struct ReplayBuffer {
    entries: Mutex<VecDeque<(i64, Arc<[u8]>)>>,
    capacity: usize,
}

impl ReplayBuffer {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        ReplayBuffer {
            entries: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity,
        }
    }

    /// Adds the newest batch, evicting the oldest beyond capacity.
    pub(crate) fn push(&self, seq: i64, payload: Arc<[u8]>) {
        let evicted = {
            let Ok(mut e) = self.entries.lock() else {
                return;
            };
            let old = (e.len() >= self.capacity).then(|| e.pop_front());
            e.push_back((seq, payload));
            old
        };
        drop(evicted); // freed outside the lock
    }

    /// Every buffered batch with seq ≥ `start`, in order (clones of the `Arc`s).
    pub(crate) fn from(&self, start: i64) -> Vec<(i64, Arc<[u8]>)> {
        let Ok(e) = self.entries.lock() else {
            return Vec::new();
        };
        let first = e.partition_point(|(s, _)| *s < start);
        e.range(first..).cloned().collect()
    }
}

/// What the replay thread owns and shares.
pub(crate) struct ReplayServer {
    pub(crate) socket: zmq::Socket,
    pub(crate) buffer: Arc<ReplayBuffer>,
    pub(crate) topic: Arc<TopicFrame>,
    pub(crate) stats: Arc<KvPublisherStats>,
    pub(crate) source: Arc<OnceLock<SnapshotSource>>,
    pub(crate) epoch: u64,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) next_barrier_id: u64,
}

impl ReplayServer {
    pub(crate) fn run(mut self) {
        while !self.stop.load(Ordering::Acquire) {
            match self.socket.poll(zmq::POLLIN, POLL_MS) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("KV replay socket poll failed: {e}; replay stops");
                    return;
                }
            }
            let mut snapshot_clients = Vec::new();
            while let Ok(frames) = self.socket.recv_multipart(zmq::DONTWAIT) {
                match &frames[..] {
                    [client, empty, req] if empty.is_empty() && req == SNAPSHOT_REQUEST => {
                        snapshot_clients.push(client.clone())
                    }
                    [client, _, start] => match <[u8; 8]>::try_from(&start[..]) {
                        Ok(b) => self.replay(client, i64::from_be_bytes(b)),
                        Err(_) => {
                            self.stats.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    _ => {
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if !snapshot_clients.is_empty() {
                self.snapshot(&snapshot_clients);
            }
        }
    }

    fn replay(&self, client: &[u8], start: i64) {
        // Counted before the answer goes out, so a client that has its end marker sees it.
        self.stats.replays.fetch_add(1, Ordering::Relaxed);
        let topic = self.topic.current();
        let mut ok = true;
        for (seq, payload) in self.buffer.from(start) {
            let f: [&[u8]; 5] = [client, b"", topic, &seq_frame(seq), &payload];
            ok &= self.socket.send_multipart(f, 0).is_ok();
        }
        let end: [&[u8]; 5] = [client, b"", b"", &seq_frame(-1), b""];
        ok &= self.socket.send_multipart(end, 0).is_ok();
        if !ok {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One cut for every client that asked in this wake-up.
    fn snapshot(&mut self, clients: &[Vec<u8>]) {
        let cut = match self.source.get() {
            Some(source) => source().ok_or("the snapshot source could not read the rank's cache"),
            None => Err("this publisher has no snapshot source (no cache to cut)"),
        };
        let replies = match cut {
            Ok(cut) => {
                let id = self.next_barrier_id;
                self.next_barrier_id += 1;
                self.stats
                    .snapshots
                    .fetch_add(clients.len() as u64, Ordering::Relaxed);
                snapshot_replies(&cut, self.epoch, id)
            }
            Err(reason) => {
                self.stats
                    .snapshot_errors
                    .fetch_add(clients.len() as u64, Ordering::Relaxed);
                let mut p = Vec::new();
                encode_error(reason, &mut p);
                vec![(KIND_ERROR, p)]
            }
        };
        for client in clients {
            let mut ok = true;
            for (kind, payload) in &replies {
                let f: [&[u8]; 4] = [client, b"", kind, payload];
                ok &= self.socket.send_multipart(f, 0).is_ok();
            }
            if !ok {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_keeps_the_newest_and_answers_from_a_seq_across_holes() {
        let b = ReplayBuffer::new(3);
        for seq in [0, 1, 3, 4] {
            b.push(seq, Arc::from(&[seq as u8][..]));
        }
        let seqs = |v: Vec<(i64, Arc<[u8]>)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(b.from(0)), [1, 3, 4]);
        assert_eq!(seqs(b.from(2)), [3, 4]);
        assert_eq!(seqs(b.from(5)), Vec::<i64>::new());
    }
}
