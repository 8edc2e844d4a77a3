//! A worker's load as a policy sees it, and one of its DP ranks' alone: `max(F, E + D)` merged from
//! the engine's snapshot (fresh), this router's dispatches since it, and its open requests
//! ([`Figures::merge`]). The worker merges its sums over ranks; a rank candidate its own figures.

use super::{DISPATCH_TOKENS_GUESS, Load, LoadSignal, REQUEST_TOKENS_WEIGHT, Source, Worker};
use std::sync::atomic::Ordering::Relaxed;

impl Worker {
    /// The worker's load under `signal`, with snapshots valid for `freshness_ms`.
    pub fn load(&self, signal: LoadSignal, freshness_ms: u64) -> Load {
        self.load_at(signal, freshness_ms, self.now_ms())
    }

    /// [`Worker::load`] at a given `now` (from [`Worker::now_ms`]).
    #[inline]
    pub fn load_at(&self, signal: LoadSignal, freshness_ms: u64, now: u64) -> Load {
        let f = self.inflight.load(Relaxed);
        if self.ranks.is_empty() {
            return Figures::inflight_only(f).merge(signal, freshness_ms, now);
        }
        let oldest_rx = self
            .agg_oldest_rx
            .load(std::sync::atomic::Ordering::Acquire);
        let mark = self.agg_mark.load(Relaxed);
        Figures {
            inflight: f,
            received_ms: oldest_rx,
            requests: self.agg_requests.load(Relaxed),
            tokens: self.agg_tokens.load(Relaxed),
            backlog: self.agg_backlog.load(Relaxed),
            dispatched_since: self.dispatched.load(Relaxed).saturating_sub(mark),
        }
        .merge(signal, freshness_ms, now)
    }

    /// The load of DP rank `rank` alone, as [`Worker::load_at`] merges it for the whole worker: the
    /// rank's engine figures, fresh on their own, plus what this router routed to the rank by name
    /// since its snapshot; else this router's open requests routed there. A rank without a slot is
    /// priced as the whole worker.
    #[inline]
    pub fn rank_load_at(&self, rank: u32, signal: LoadSignal, freshness_ms: u64, now: u64) -> Load {
        let Some(r) = self.ranks.get(rank as usize) else {
            return self.load_at(signal, freshness_ms, now);
        };
        let routed = &r.routed;
        Figures {
            inflight: routed.inflight.load(Relaxed),
            received_ms: r.received_ms.load(std::sync::atomic::Ordering::Acquire),
            requests: r.requests.load(Relaxed),
            tokens: r.tokens.load(Relaxed),
            backlog: r.backlog.load(Relaxed),
            dispatched_since: routed
                .dispatched
                .load(Relaxed)
                .saturating_sub(routed.dispatch_mark.load(Relaxed)),
        }
        .merge(signal, freshness_ms, now)
    }
}

/// What one load is merged from: a worker's sums over its ranks, or one rank's own figures.
struct Figures {
    /// This router's open requests.
    inflight: i64,
    /// Receive time of the (oldest) snapshot, ms; 0: none yet.
    received_ms: u64,
    requests: i64,
    tokens: i64,
    backlog: i64,
    /// This router's dispatches since that snapshot.
    dispatched_since: u64,
}

impl Figures {
    fn inflight_only(inflight: i64) -> Self {
        Figures {
            inflight,
            received_ms: 0,
            requests: 0,
            tokens: 0,
            backlog: 0,
            dispatched_since: 0,
        }
    }

    /// `max(F, E + D)` when the snapshot is fresh and the signal is the engine's, else `F`.
    #[inline]
    fn merge(self, signal: LoadSignal, freshness_ms: u64, now: u64) -> Load {
        let f = self.inflight.max(0);
        // Under the backlog signal every score is in prompt tokens, fallback included.
        let unit = if signal == LoadSignal::Backlog {
            DISPATCH_TOKENS_GUESS
        } else {
            1
        };
        let age_ms = if self.received_ms == 0 {
            u64::MAX
        } else {
            now.saturating_sub(self.received_ms)
        };
        if signal == LoadSignal::Inflight || age_ms > freshness_ms {
            return Load {
                requests: f,
                tokens: 0,
                score: f.saturating_mul(unit),
                source: Source::Fallback,
                age_ms,
            };
        }
        let e = self.requests;
        let d = i64::try_from(self.dispatched_since).unwrap_or(i64::MAX);
        let requests = f.max(e.saturating_add(d));
        let score = match signal {
            LoadSignal::Backlog => self
                .backlog
                .saturating_add(d.saturating_mul(DISPATCH_TOKENS_GUESS))
                .saturating_add(e.saturating_mul(REQUEST_TOKENS_WEIGHT)),
            _ => requests,
        };
        Load {
            requests,
            score,
            tokens: self.tokens,
            source: Source::Engine,
            age_ms,
        }
    }
}
