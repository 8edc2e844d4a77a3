//! The KV-event publisher of one rank: SGLang's `ZmqEventPublisher` contract, written for a
//! scheduler that must never wait, and for subscribers that must never miss a loss unawares.
//!
//! * The scheduler hands over each step's events with [`KvEventPublisher::publish`]. The seq is
//!   assigned right there, on the caller's side (an atomic the publisher exposes as [`KvSeq`]),
//!   **before** the bounded queue (`max_queue_size`): a batch dropped on a full queue is a seq
//!   hole every subscriber sees as a gap (and counts in `dropped`), never a silent divergence.
//!   The scheduler is never blocked.
//! * A background thread encodes each batch once and sends `[topic, seq BE, payload]` on a PUB
//!   bound at the rank's endpoint (HWM `hwm`: a slow subscriber loses batches at the socket, and
//!   sees the hole), and pushes `(seq, payload)` into the replay buffer (`buffer_steps` batches).
//! * Replay and snapshots are served by a second thread that owns the ROUTER (see
//!   [`crate::kv_replay`]), so neither can stall the live stream.
//! * Each publisher lifetime has an epoch (ns since the UNIX epoch at bind, strictly larger than
//!   any earlier one in the process). With `epoch_in_topic` (the default) the topic frame of live
//!   and replayed batches is `{topic}\0sgl-kv-epoch={epoch}`, as SGLang's v2 draft writes it; a
//!   SUB subscribed to `topic` still matches it (prefix match).

use crate::kv_cut::SnapshotSource;
use crate::kv_replay::{ReplayBuffer, ReplayServer};
use crate::sink::SinkError;
use loadlink_wire::frame::seq_frame;
use loadlink_wire::kv_events::{KvEventBatch, encode_kv_batch};
use loadlink_wire::kv_snapshot::epoch_topic;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where and how one rank publishes.
#[derive(Debug, Clone)]
pub struct KvPublisherConfig {
    /// `tcp://*:PORT` for this rank (the config's endpoint port + rank).
    pub endpoint: String,
    /// `tcp://*:PORT` of this rank's replay ROUTER, when replay is configured.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub buffer_steps: usize,
    pub hwm: i32,
    pub max_queue_size: usize,
    /// Append `\0sgl-kv-epoch={epoch}` to the topic frame (default on; see
    /// [`KvEventPublisher::set_epoch_in_topic`]).
    pub epoch_in_topic: bool,
}

impl KvPublisherConfig {
    /// SGLang's defaults (`KVEventsConfig`) for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        KvPublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            epoch_in_topic: true,
        }
    }
}

/// Counters of one rank's KV publisher, shared with `/metrics`.
#[derive(Debug, Default)]
pub struct KvPublisherStats {
    /// Batches sent on the PUB socket.
    pub published: AtomicU64,
    /// Batches dropped because the queue was full (each one a seq hole).
    pub dropped: AtomicU64,
    /// Replay requests received (well-formed).
    pub replays: AtomicU64,
    /// Snapshot answers served (header, chunks, end), one per requesting client.
    pub snapshots: AtomicU64,
    /// Snapshot requests answered with `error` (no source, or the source failed).
    pub snapshot_errors: AtomicU64,
    /// Send or replay errors, and malformed requests.
    pub errors: AtomicU64,
}

/// The seq counter of one publisher: read the last assigned seq where the batches are handed
/// over (under the same lock), and the two agree.
#[derive(Debug, Clone)]
pub struct KvSeq(Arc<AtomicI64>);

impl KvSeq {
    /// The seq of the last batch handed to [`KvEventPublisher::publish`] (published or dropped);
    /// −1 before the first.
    pub fn last_assigned(&self) -> i64 {
        self.0.load(Ordering::Acquire) - 1
    }
}

/// The topic frame, with and without the epoch suffix, and which one is sent.
pub(crate) struct TopicFrame {
    plain: Vec<u8>,
    with_epoch: Vec<u8>,
    epoch_on: AtomicBool,
}

impl TopicFrame {
    pub(crate) fn current(&self) -> &[u8] {
        if self.epoch_on.load(Ordering::Relaxed) {
            &self.with_epoch
        } else {
            &self.plain
        }
    }
}

/// The largest request frame the replay ROUTER accepts (a replay's 8-byte seq, `snapshot-v1`).
const MAX_REQUEST_BYTES: i64 = 64;

/// The last epoch handed out in this process: a restart within one process (tests, a rebind)
/// must still see a larger epoch, even if the clock did not move or went back.
static LAST_EPOCH: AtomicU64 = AtomicU64::new(0);

fn next_epoch() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let prev = LAST_EPOCH
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
            Some(now.max(last.saturating_add(1)))
        })
        .unwrap_or(0);
    now.max(prev.saturating_add(1))
}

pub struct KvEventPublisher {
    tx: Option<SyncSender<(i64, KvEventBatch)>>,
    next_seq: Arc<AtomicI64>,
    epoch: u64,
    topic: Arc<TopicFrame>,
    source: Arc<OnceLock<SnapshotSource>>,
    stats: Arc<KvPublisherStats>,
    stop_replay: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    replay_thread: Option<std::thread::JoinHandle<()>>,
}

impl KvEventPublisher {
    /// Binds the PUB (and the replay ROUTER) and starts the threads.
    pub fn bind(ctx: &zmq::Context, cfg: KvPublisherConfig) -> Result<Self, SinkError> {
        let pub_socket = ctx.socket(zmq::PUB)?;
        pub_socket.set_sndhwm(cfg.hwm)?;
        pub_socket.set_linger(0)?;
        pub_socket.bind(&cfg.endpoint)?;
        let replay = match &cfg.replay_endpoint {
            Some(ep) => {
                let s = ctx.socket(zmq::ROUTER)?;
                s.set_linger(0)?;
                // Requests are at most 11 bytes: a peer sending more is cut off, not buffered.
                s.set_maxmsgsize(MAX_REQUEST_BYTES)?;
                // A whole replay (every buffered batch and the end marker) fits the queue of one
                // peer; a ROUTER drops silently past its high-water mark.
                s.set_sndhwm(
                    i32::try_from(cfg.buffer_steps.saturating_add(64))
                        .unwrap_or(i32::MAX)
                        .max(1000),
                )?;
                s.bind(ep)?;
                Some(s)
            }
            None => None,
        };
        let epoch = next_epoch();
        let mut with_epoch = Vec::with_capacity(cfg.topic.len() + 40);
        epoch_topic(cfg.topic.as_bytes(), epoch, &mut with_epoch);
        let topic = Arc::new(TopicFrame {
            plain: cfg.topic.into_bytes(),
            with_epoch,
            epoch_on: AtomicBool::new(cfg.epoch_in_topic),
        });
        let (tx, rx) = sync_channel(cfg.max_queue_size.max(1));
        let stats = Arc::new(KvPublisherStats::default());
        let source = Arc::new(OnceLock::new());
        let stop_replay = Arc::new(AtomicBool::new(false));
        let buffer = replay
            .is_some()
            .then(|| Arc::new(ReplayBuffer::new(cfg.buffer_steps)));
        let replay_thread = match (replay, &buffer) {
            (Some(socket), Some(buffer)) => {
                let server = ReplayServer {
                    socket,
                    buffer: buffer.clone(),
                    topic: topic.clone(),
                    stats: stats.clone(),
                    source: source.clone(),
                    epoch,
                    stop: stop_replay.clone(),
                    next_barrier_id: 1,
                };
                Some(
                    std::thread::Builder::new()
                        .name("kv-replay".into())
                        .spawn(move || server.run())
                        .map_err(SinkError::Io)?,
                )
            }
            _ => None,
        };
        let worker = Worker {
            pub_socket,
            buffer,
            topic: topic.clone(),
            scratch: Vec::with_capacity(256),
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || worker.run(rx));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                stop_replay.store(true, Ordering::Release);
                if let Some(t) = replay_thread {
                    let _ = t.join();
                }
                return Err(SinkError::Io(e));
            }
        };
        Ok(KvEventPublisher {
            tx: Some(tx),
            next_seq: Arc::new(AtomicI64::new(0)),
            epoch,
            topic,
            source,
            stats,
            stop_replay,
            thread: Some(thread),
            replay_thread,
        })
    }

    /// Assigns the batch the next seq and hands it to the publishing thread; `false` when the
    /// queue was full (dropped and counted: the seq stays a hole). Call it from one thread at a
    /// time (the scheduler's), or seqs may reach the queue out of order.
    pub fn publish(&self, batch: KvEventBatch) -> bool {
        let seq = self.next_seq.fetch_add(1, Ordering::AcqRel);
        let Some(tx) = &self.tx else {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        match tx.try_send((seq, batch)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The seq counter, for reading the last assigned seq elsewhere (a snapshot source).
    pub fn seq(&self) -> KvSeq {
        KvSeq(self.next_seq.clone())
    }

    /// This publisher lifetime's epoch (ns since the UNIX epoch at bind).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Turns the topic frame's epoch suffix on or off (before the first batch, or replayed
    /// frames will differ from the live ones they copy).
    pub fn set_epoch_in_topic(&self, on: bool) {
        self.topic.epoch_on.store(on, Ordering::Relaxed);
    }

    /// Installs the snapshot source, called on the replay thread for each snapshot cut. Set once
    /// (the engine builds its publisher before the scheduler it cuts); `false` when one was set.
    pub fn set_snapshot_source(&self, source: SnapshotSource) -> bool {
        self.source.set(source).is_ok()
    }

    pub fn stats(&self) -> Arc<KvPublisherStats> {
        self.stats.clone()
    }

    /// Sends what is queued, then stops both threads and closes the sockets.
    pub fn close(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stop_replay.store(true, Ordering::Release);
        if let Some(t) = self.replay_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// The publishing thread: encode, send, buffer. It never reads a socket.
struct Worker {
    pub_socket: zmq::Socket,
    buffer: Option<Arc<ReplayBuffer>>,
    topic: Arc<TopicFrame>,
    scratch: Vec<u8>,
    stats: Arc<KvPublisherStats>,
}

impl Worker {
    fn run(mut self, rx: Receiver<(i64, KvEventBatch)>) {
        while let Ok((seq, batch)) = rx.recv() {
            self.send(seq, &batch);
        }
    }

    fn send(&mut self, seq: i64, batch: &KvEventBatch) {
        self.scratch.clear();
        encode_kv_batch(batch, &mut self.scratch);
        let frames: [&[u8]; 3] = [self.topic.current(), &seq_frame(seq), &self.scratch];
        match self.pub_socket.send_multipart(frames, zmq::DONTWAIT) {
            Ok(()) => self.stats.published.fetch_add(1, Ordering::Relaxed),
            // At HWM the PUB drops for that subscriber by itself; EAGAIN does not occur on PUB.
            Err(_) => self.stats.errors.fetch_add(1, Ordering::Relaxed),
        };
        if let Some(b) = &self.buffer {
            b.push(seq, Arc::from(&self.scratch[..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_only_grow_and_start_at_the_clock() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let epochs: Vec<u64> = (0..10_000).map(|_| next_epoch()).collect();
        assert!(epochs[0] >= before);
        assert!(epochs.windows(2).all(|w| w[1] > w[0]));
    }
}
