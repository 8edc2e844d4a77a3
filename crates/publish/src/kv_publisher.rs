//! The KV-event publisher of one rank: SGLang's `ZmqEventPublisher` contract, written for a
//! scheduler that must never wait.
//!
//! * The scheduler hands over each step's events with [`KvEventPublisher::publish`]: a
//!   `try_send` into a bounded queue (`max_queue_size`). A full queue drops the batch and counts it;
//!   the scheduler is never blocked.
//! * A background thread numbers each batch (seq from 0), encodes it once and sends the three
//!   frames `[topic, seq BE, payload]` on a PUB bound at the rank's endpoint (HWM `hwm`: a slow
//!   subscriber loses batches at the socket, never the scheduler's time), and keeps the last
//!   `buffer_steps` batches for replay.
//! * Replay: a ROUTER at the rank's replay endpoint. A DEALER sends `[b"", start seq]`; it gets
//!   every buffered batch from that seq as `[b"", topic, seq, payload]`, then the end marker
//!   `[b"", b"", -1, b""]`. A subscriber that saw a gap can recover what it missed while the
//!   buffer still holds it.

use crate::sink::SinkError;
use loadlink_wire::frame::seq_frame;
use loadlink_wire::kv_events::{KvEventBatch, encode_kv_batch};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

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
        }
    }
}

/// Counters of one rank's KV publisher, shared with `/metrics`.
#[derive(Debug, Default)]
pub struct KvPublisherStats {
    /// Batches sent on the PUB socket.
    pub published: AtomicU64,
    /// Batches dropped because the queue was full (the publisher thread fell behind).
    pub dropped: AtomicU64,
    /// Replay requests received (well-formed).
    pub replays: AtomicU64,
    /// Send or replay errors.
    pub errors: AtomicU64,
}

pub struct KvEventPublisher {
    tx: Option<SyncSender<KvEventBatch>>,
    stats: Arc<KvPublisherStats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long the thread waits for a batch before it looks at the replay socket again.
const REPLAY_POLL: Duration = Duration::from_millis(5);

impl KvEventPublisher {
    /// Binds the PUB (and the replay ROUTER) and starts the thread.
    pub fn bind(ctx: &zmq::Context, cfg: KvPublisherConfig) -> Result<Self, SinkError> {
        let pub_socket = ctx.socket(zmq::PUB)?;
        pub_socket.set_sndhwm(cfg.hwm)?;
        pub_socket.set_linger(0)?;
        pub_socket.bind(&cfg.endpoint)?;
        let replay = match &cfg.replay_endpoint {
            Some(ep) => {
                let s = ctx.socket(zmq::ROUTER)?;
                s.set_linger(0)?;
                s.bind(ep)?;
                Some(s)
            }
            None => None,
        };
        let (tx, rx) = sync_channel(cfg.max_queue_size.max(1));
        let stats = Arc::new(KvPublisherStats::default());
        let mut worker = Worker {
            pub_socket,
            replay,
            topic: cfg.topic.into_bytes(),
            buffer: VecDeque::with_capacity(cfg.buffer_steps.min(1024)),
            buffer_steps: cfg.buffer_steps.max(1),
            seq: 0,
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || worker.run(rx))
            .map_err(SinkError::Io)?;
        Ok(KvEventPublisher {
            tx: Some(tx),
            stats,
            thread: Some(thread),
        })
    }

    /// Hands a batch to the publisher thread; `false` when the queue was full (dropped, counted).
    pub fn publish(&self, batch: KvEventBatch) -> bool {
        let Some(tx) = &self.tx else {
            return false;
        };
        match tx.try_send(batch) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    pub fn stats(&self) -> Arc<KvPublisherStats> {
        self.stats.clone()
    }

    /// Sends what is queued, then stops the thread and closes the sockets.
    pub fn close(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

struct Worker {
    pub_socket: zmq::Socket,
    replay: Option<zmq::Socket>,
    topic: Vec<u8>,
    buffer: VecDeque<(i64, Vec<u8>)>,
    buffer_steps: usize,
    seq: i64,
    stats: Arc<KvPublisherStats>,
}

impl Worker {
    fn run(&mut self, rx: Receiver<KvEventBatch>) {
        loop {
            self.serve_replays();
            match rx.recv_timeout(REPLAY_POLL) {
                Ok(batch) => self.send(&batch),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn send(&mut self, batch: &KvEventBatch) {
        // Reuse the buffer slot that falls out of the replay window.
        let mut payload = if self.buffer.len() >= self.buffer_steps {
            self.buffer.pop_front().map(|(_, b)| b).unwrap_or_default()
        } else {
            Vec::with_capacity(256)
        };
        payload.clear();
        encode_kv_batch(batch, &mut payload);
        let seq = self.seq;
        self.seq += 1;
        let frames: [&[u8]; 3] = [&self.topic, &seq_frame(seq), &payload];
        match self.pub_socket.send_multipart(frames, zmq::DONTWAIT) {
            Ok(()) => self.stats.published.fetch_add(1, Ordering::Relaxed),
            // At HWM the PUB drops for that subscriber by itself; EAGAIN does not occur on PUB.
            Err(_) => self.stats.errors.fetch_add(1, Ordering::Relaxed),
        };
        self.buffer.push_back((seq, payload));
    }

    fn serve_replays(&mut self) {
        let Some(replay) = &self.replay else {
            return;
        };
        while let Ok(frames) = replay.recv_multipart(zmq::DONTWAIT) {
            let [client, _, start] = &frames[..] else {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(i64::from_be_bytes) else {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            // Counted before the answer goes out, so a client that has its end marker sees it.
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
            let mut ok = true;
            for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
                let f: [&[u8]; 5] = [client, b"", &self.topic, &seq_frame(*seq), payload];
                ok &= replay.send_multipart(f, 0).is_ok();
            }
            let end: [&[u8]; 5] = [client, b"", b"", &seq_frame(-1), b""];
            ok &= replay.send_multipart(end, 0).is_ok();
            if !ok {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
