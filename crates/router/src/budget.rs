//! Peer budgets: the one list of why the router refused or dropped something a worker or a client
//! sent. Every peer is untrusted (bodies, ranks, message sizes, response times); each budget lives
//! beside the code that enforces it, and every refusal is counted here under one [`Refusal`]
//! reason, so `/metrics` (`loadlink_peer_refusals_total{reason}`, and per worker
//! `loadlink_worker_refusals_total{worker,reason}`) and `/workers` (`refusals`, `last_refusal`)
//! show it, not only a log line. `docs/router.md` ("Budgets") lists every budget and its flag.
//!
//! Counting is lock-free (one atomic per reason); the last refusal's text is kept per worker under
//! a mutex that is taken only when a refusal happens, and at most once a second per worker after
//! the first of each reason (the rest are counted, not described).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The budgets themselves: one value per thing a peer controls. Part of
/// [`crate::RouterConfig`] (`cfg.budgets`); each field names the code that enforces it and its
/// flag. Defaults are what an operator gets without flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Budgets {
    /// Largest `/server_info` body read at discovery (`--discovery-max-body-bytes`).
    pub discovery_body_bytes: usize,
    /// One discovery attempt, connect to last body byte (`--discovery-timeout-ms`).
    pub discovery_timeout: Duration,
    /// Largest load-poll body (`/v1/loads`, `/metrics`) (`--load-poll-max-body-bytes`).
    pub poll_body_bytes: usize,
    /// Largest body of one worker's answer to a fan-out (`/v1/models`) (`--fanout-max-body-bytes`).
    pub fanout_body_bytes: usize,
    /// One fan-out request to one worker, headers and body (`--fanout-timeout-ms`).
    pub fanout_timeout: Duration,
    /// DP ranks believed of one worker when it advertises no `dp_size` (`--max-ranks`).
    pub max_ranks: usize,
    /// Largest load-stream message (`--load-message-max-bytes`); a load message is < 200 bytes.
    pub load_message_bytes: usize,
    /// Largest KV-event batch (`--kv-message-max-bytes`).
    pub kv_message_bytes: usize,
    /// Bytes one subscription socket may queue; its receive high-water mark is this divided by
    /// the stream's message budget (`--socket-queue-bytes`).
    pub socket_queue_bytes: usize,
    /// Messages one stream may have handled per ingest wakeup before the others get a turn
    /// (`--ingest-batch-messages`).
    pub wakeup_messages: usize,
    /// KV-index blocks one worker rank may hold (`--kv-index-max-blocks-per-rank`).
    pub index_blocks_per_rank: usize,
    /// Dial KV hosts a worker advertises instead of its URL's host (`--trust-advertised-hosts`).
    pub trust_advertised_hosts: bool,
    /// Consecutive empty answers of a membership source before its workers are removed
    /// (`--membership-empty-answers`).
    pub membership_empty_answers: u32,
    /// Threads that run request-path CPU work (body parse, tokenization, block hashing) off the
    /// async executor; 0: one per core (`--request-work-threads`). See [`crate::request_work`].
    pub request_work_threads: usize,
    /// Requests whose CPU work may wait for one of those threads; beyond it 503
    /// (`request_too_large`) (`--request-work-queue`).
    pub request_work_queue: usize,
    /// Bodies up to this size are worked inline on the executor, where the work costs less than
    /// the hop to a thread (`--request-work-inline-bytes`).
    pub request_work_inline_bytes: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            discovery_body_bytes: 1 << 20,
            discovery_timeout: Duration::from_secs(5),
            poll_body_bytes: 8 << 20,
            fanout_body_bytes: 1 << 20,
            fanout_timeout: Duration::from_secs(2),
            max_ranks: 1024,
            load_message_bytes: 64 << 10,
            kv_message_bytes: 1 << 20,
            socket_queue_bytes: 8 << 20,
            wakeup_messages: 256,
            index_blocks_per_rank: 1 << 20,
            trust_advertised_hosts: false,
            membership_empty_answers: 3,
            request_work_threads: 0,
            request_work_queue: 64,
            request_work_inline_bytes: 16 << 10,
        }
    }
}

impl Budgets {
    /// The receive high-water mark (messages) that keeps a socket whose messages are at most
    /// `message_bytes` within [`Budgets::socket_queue_bytes`].
    pub fn rcvhwm(&self, message_bytes: usize) -> i32 {
        (self.socket_queue_bytes / message_bytes.max(1)).clamp(1, i32::MAX as usize) as i32
    }
}

/// Why a peer's input was refused or dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// An HTTP answer (discovery, poll, fan-out) larger than its byte budget.
    BodyTooLarge,
    /// An HTTP answer (headers and body) not complete within its time budget.
    TimedOut,
    /// A DP rank beyond the worker's advertised `dp_size` or the rank budget.
    RankOutOfRange,
    /// A load-stream message larger than the load message budget.
    LoadMessageTooLarge,
    /// A KV-event message larger than the KV message budget.
    KvMessageTooLarge,
    /// A number the router cannot hold (it would overflow, or a count is negative).
    NumberOutOfRange,
    /// A subscription not opened: the file-descriptor or libzmq socket limit could not grow.
    SocketLimit,
    /// An advertised host not dialled (it is not the worker URL's host and
    /// `--trust-advertised-hosts` is off, or it is not routable).
    UntrustedHost,
    /// KV-index blocks beyond the per-worker quota (that rank is priced from the approximate tree).
    IndexQuota,
    /// A client request body beyond its size budget, or work beyond the request-path budget.
    RequestTooLarge,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::BodyTooLarge,
        Refusal::TimedOut,
        Refusal::RankOutOfRange,
        Refusal::LoadMessageTooLarge,
        Refusal::KvMessageTooLarge,
        Refusal::NumberOutOfRange,
        Refusal::SocketLimit,
        Refusal::UntrustedHost,
        Refusal::IndexQuota,
        Refusal::RequestTooLarge,
    ];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::TimedOut => "timed_out",
            Refusal::RankOutOfRange => "rank_out_of_range",
            Refusal::LoadMessageTooLarge => "load_message_too_large",
            Refusal::KvMessageTooLarge => "kv_message_too_large",
            Refusal::NumberOutOfRange => "number_out_of_range",
            Refusal::SocketLimit => "socket_limit",
            Refusal::UntrustedHost => "untrusted_host",
            Refusal::IndexQuota => "index_quota",
            Refusal::RequestTooLarge => "request_too_large",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One counter per [`Refusal`].
#[derive(Debug, Default)]
pub struct RefusalCounts([AtomicU64; Refusal::ALL.len()]);

impl RefusalCounts {
    pub fn add(&self, r: Refusal, n: u64) {
        self.0[r.index()].fetch_add(n, Relaxed);
    }

    pub fn get(&self, r: Refusal) -> u64 {
        self.0[r.index()].load(Relaxed)
    }

    /// Every reason with its count, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (Refusal, u64)> + '_ {
        Refusal::ALL.into_iter().map(|r| (r, self.get(r)))
    }

    pub fn total(&self) -> u64 {
        self.iter().map(|(_, n)| n).sum()
    }
}

/// A worker's refusals: its own counts, the text of the latest one, and the fleet-wide counts it
/// also adds to (attached when the worker joins a fleet; a removed worker's counts stay there).
#[derive(Debug, Default)]
pub struct PeerRefusals {
    counts: RefusalCounts,
    fleet: OnceLock<Arc<RefusalCounts>>,
    last: Mutex<Option<LastRefusal>>,
}

#[derive(Debug, Clone)]
struct LastRefusal {
    reason: Refusal,
    text: String,
    at: Instant,
}

/// How often the kept text of a repeating refusal is replaced.
const DESCRIBE_EVERY_SECS: u64 = 1;

impl PeerRefusals {
    /// Also count into `fleet` from now on (the first attachment wins).
    pub fn attach(&self, fleet: Arc<RefusalCounts>) {
        let _ = self.fleet.set(fleet);
    }

    /// Counts a refusal; `describe` is called (and its text kept for `/workers`) on the first of
    /// each reason and otherwise at most once a second, so a flood costs one atomic add each.
    pub fn refuse(&self, reason: Refusal, describe: impl FnOnce() -> String) {
        let first = self.counts.0[reason.index()].fetch_add(1, Relaxed) == 0;
        if let Some(f) = self.fleet.get() {
            f.add(reason, 1);
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let due = match &*last {
            None => true,
            Some(l) => first || l.at.elapsed().as_secs() >= DESCRIBE_EVERY_SECS,
        };
        if due {
            let text = describe();
            if first {
                tracing::warn!(reason = reason.as_str(), "peer refused: {text}");
            }
            *last = Some(LastRefusal {
                reason,
                text,
                at: Instant::now(),
            });
        }
    }

    pub fn counts(&self) -> &RefusalCounts {
        &self.counts
    }

    /// `"reason: text"` of the latest described refusal.
    pub fn last(&self) -> Option<String> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .map(|l| format!("{}: {}", l.reason.as_str(), l.text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_worker_and_fleet_and_keeps_the_first_text() {
        let fleet = Arc::new(RefusalCounts::default());
        let w = PeerRefusals::default();
        w.refuse(Refusal::TimedOut, || "before attach".into());
        w.attach(fleet.clone());
        w.refuse(Refusal::RankOutOfRange, || "rank 9 of 2".into());
        let mut called = false;
        w.refuse(Refusal::RankOutOfRange, || {
            called = true;
            "rank 10 of 2".into()
        });
        assert!(
            !called,
            "a repeat within a second is counted, not described"
        );
        assert_eq!(w.counts().get(Refusal::RankOutOfRange), 2);
        assert_eq!(w.counts().get(Refusal::TimedOut), 1);
        assert_eq!(fleet.get(Refusal::RankOutOfRange), 2);
        assert_eq!(fleet.get(Refusal::TimedOut), 0, "counted before it joined");
        assert_eq!(w.last().as_deref(), Some("rank_out_of_range: rank 9 of 2"));
        assert_eq!(fleet.total(), 2);
    }

    #[test]
    fn reasons_are_distinct_labels() {
        let mut labels: Vec<_> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Refusal::ALL.len());
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "ALL is in declaration order");
        }
    }
}
