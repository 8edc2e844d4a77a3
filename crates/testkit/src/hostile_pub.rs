//! A publisher that sends whatever it is told to: oversized messages, random bytes, floods of
//! valid KV-event batches, or a quiet trickle of load snapshots. Its own thread and libzmq
//! context, a real PUB socket bound on a TCP endpoint; it runs until dropped.
//!
//! Why a thread that never waits for its subscriber: a hostile peer does not either. The PUB
//! drops what its send queue cannot hold, like an engine's does, so a flood runs at whatever pace
//! libzmq and the subscriber allow. The publisher monitors its own socket and counts accepted
//! connections ([`HostilePub::accepted`]): a router that drops a connection (libzmq does, on a
//! message over `ZMQ_MAXMSGSIZE`) reconnects, so more than one accept is the publisher-side proof
//! of a refusal, without trusting the router's own counters.

use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch, kv_batch_bytes};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the publisher sends: the frames of message number `n` (0, 1, …).
pub type Script = Box<dyn FnMut(u64) -> Vec<Vec<u8>> + Send>;

/// A running publisher (see the module docs).
pub struct HostilePub {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl HostilePub {
    /// Binds a PUB on `endpoint` (e.g. `tcp://127.0.0.1:5557`) and sends `script`'s messages,
    /// waiting `every` between two (zero: as fast as libzmq takes them). Panics if it cannot bind.
    pub fn start(endpoint: &str, every: Duration, mut script: Script) -> Self {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::PUB).expect("a PUB socket");
        s.set_linger(0).expect("linger");
        s.set_sndhwm(1000).expect("sndhwm");
        let mon = format!(
            "inproc://hostile-pub-monitor-{}",
            NEXT.fetch_add(1, Relaxed)
        );
        s.monitor(&mon, zmq::SocketEvent::ACCEPTED as i32)
            .expect("monitor the PUB");
        let events = ctx.socket(zmq::PAIR).expect("a PAIR socket");
        events.connect(&mon).expect("connect the monitor");
        s.bind(endpoint)
            .unwrap_or_else(|e| panic!("bind {endpoint}: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let (st, se, ac) = (stop.clone(), sent.clone(), accepted.clone());
        let thread = std::thread::Builder::new()
            .name("hostile-pub".into())
            .spawn(move || {
                let _ctx = ctx;
                let mut n = 0;
                while !st.load(Relaxed) {
                    while let Ok(ev) = events.recv_multipart(zmq::DONTWAIT) {
                        let is_accept = ev.first().and_then(|f| f.get(..2)).is_some_and(|b| {
                            u16::from_le_bytes([b[0], b[1]]) == zmq::SocketEvent::ACCEPTED as u16
                        });
                        ac.fetch_add(u64::from(is_accept), Relaxed);
                    }
                    let frames = script(n);
                    if s.send_multipart(&frames, zmq::DONTWAIT).is_ok() {
                        se.fetch_add(1, Relaxed);
                    }
                    n += 1;
                    if every.is_zero() {
                        if n % 64 == 0 {
                            std::thread::yield_now();
                        }
                    } else {
                        std::thread::sleep(every);
                    }
                }
            })
            .expect("spawn the publisher");
        HostilePub {
            stop,
            sent,
            accepted,
            thread: Some(thread),
        }
    }

    /// Messages handed to libzmq so far (a PUB may still drop them).
    pub fn sent(&self) -> u64 {
        self.sent.load(Relaxed)
    }

    /// Connections the PUB has accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Relaxed)
    }
}

impl Drop for HostilePub {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// `[topic, seq, payload]`: the three frames of a load or KV-event message.
pub fn message(topic: &[u8], seq: i64, payload: Vec<u8>) -> Vec<Vec<u8>> {
    vec![topic.to_vec(), seq.to_be_bytes().to_vec(), payload]
}

/// Load messages whose payload is `bytes` bytes of noise, seq counting up.
pub fn oversized(bytes: usize) -> Script {
    Box::new(move |n| message(b"", n as i64, vec![0xa5; bytes]))
}

/// Messages of 1 to 4 frames of random bytes, up to `max_bytes` each, from `seed`.
pub fn random_frames(seed: u64, max_bytes: usize) -> Script {
    let mut x = seed | 1;
    let mut next = move || {
        // xorshift64: enough noise for a fuzzing peer, and reproducible from the seed.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    Box::new(move |_| {
        let frames = 1 + next() % 4;
        (0..frames)
            .map(|_| {
                let len = (next() as usize) % (max_bytes.max(1) + 1);
                (0..len).map(|_| next() as u8).collect()
            })
            .collect()
    })
}

/// Valid generation-A load snapshots with `num_waiting_reqs` = `waiting`, seq counting up.
pub fn snapshots(waiting: i64) -> Script {
    Box::new(move |n| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let snap = LoadSnapshot {
            num_waiting_reqs: waiting,
            timestamp: Some(now),
            ..Default::default()
        };
        message(b"", n as i64, snapshot_bytes(&snap))
    })
}

/// The encoding of one KV-event batch storing `hashes` as one chain from the root.
pub fn kv_batch(hashes: &[i64]) -> Vec<u8> {
    let batch = KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            token_ids: vec![1; hashes.len() * 16],
            block_size: 16,
            ..Default::default()
        })],
        attn_dp_rank: None,
    };
    kv_batch_bytes(&batch)
}

/// Valid KV-event batches, every one storing the same `hashes`, seq counting up (the batch is
/// encoded once: the publisher's cost per message is a copy, the subscriber's a full apply).
pub fn kv_batches(hashes: Vec<i64>) -> Script {
    let payload = kv_batch(&hashes);
    Box::new(move |n| message(b"", n as i64, payload.clone()))
}
