//! Storing one engine message in the book: each rank's numbers, believed within range, its
//! prefill speed and utilisation meters fed, and the worker's sums over ranks recomputed, so a pick
//! reads one worker's figures from a few atomics instead of walking its ranks.

use super::prefill_rate::PRIOR_US_PER_TOKEN;
use super::utilisation::UtilSample;
use super::{MAX_REPORTED, RankOutOfRange, Worker};
use crate::budget::Refusal;
use loadlink_wire::LoadSnapshot;
use std::sync::atomic::Ordering::Relaxed;

impl Worker {
    /// Stores `rank`'s numbers from `snap` as received at `now`, without looking at a seq (the
    /// ingest decodes only the newest of a backlog and accounts every seq with
    /// [`Worker::account_seq`]). False for a rank without a slot (refused as
    /// [`Refusal::RankOutOfRange`] when the peer named it). Counts outside what the book believes
    /// (negative, or beyond [`MAX_REPORTED`]) are clamped and counted as
    /// [`Refusal::NumberOutOfRange`].
    pub fn apply_at(&self, rank: usize, snap: &LoadSnapshot, now: u64) -> bool {
        let r = match self.ranks.get_or_claim(rank) {
            Ok(r) => r,
            Err(e) => {
                self.refuse_rank(e);
                return false;
            }
        };
        // The first field outside what is believed, and that range's top (0: a counter that
        // only has to be >= 0).
        let mut out_of_range: Option<(&'static str, i64)> = None;
        let mut believe = |field: &'static str, v: i64, max: i64| {
            if !(0..=max).contains(&v) {
                out_of_range.get_or_insert((field, max));
            }
            v.clamp(0, max)
        };
        let running = believe("num_running_reqs", snap.num_running_reqs, MAX_REPORTED);
        let waiting = believe("num_waiting_reqs", snap.num_waiting_reqs, MAX_REPORTED);
        let tokens = believe(
            "num_total_tokens",
            snap.num_total_tokens.max(snap.num_used_tokens),
            MAX_REPORTED * 1000,
        );
        let backlog = believe(
            "num_waiting_uncached_tokens",
            snap.num_waiting_uncached_tokens,
            MAX_REPORTED * 1000,
        );
        let max_running = believe(
            "max_running_requests",
            snap.max_running_requests,
            MAX_REPORTED,
        );
        let pool = believe(
            "max_total_num_tokens",
            snap.max_total_num_tokens,
            MAX_REPORTED * 1000,
        );
        let used = believe("num_used_tokens", snap.num_used_tokens, MAX_REPORTED * 1000);
        let free = if pool > 0 {
            pool.saturating_sub(used).max(0) as u64
        } else {
            super::ranks::POOL_UNKNOWN
        };
        r.pool_free.store(free, Relaxed);
        r.running.store(running, Relaxed);
        r.waiting.store(waiting, Relaxed);
        r.requests.store(running + waiting, Relaxed);
        r.tokens.store(tokens, Relaxed);
        r.backlog.store(backlog, Relaxed);
        let pending = crate::pd::metrics::pending_transfers(snap.disaggregation.as_ref());
        r.pd_pending
            .store(believe("disaggregation", pending, MAX_REPORTED), Relaxed);
        let usage = snap.token_usage();
        r.token_usage_bits.store(
            if usage.is_finite() {
                usage.clamp(0.0, 1.0)
            } else {
                0.0
            }
            .to_bits(),
            Relaxed,
        );
        let (prefill_tokens, prefill_us) = (
            snap.total_prefill_uncached_tokens,
            snap.total_prefill_busy_us,
        );
        if prefill_tokens < 0 || prefill_us < 0 {
            out_of_range.get_or_insert(("total_prefill_uncached_tokens/total_prefill_busy_us", 0));
        } else {
            r.prefill.observe(prefill_tokens, prefill_us);
            let us = r.prefill.us_per_token().unwrap_or(PRIOR_US_PER_TOKEN);
            r.us_per_token_bits.store(us.to_bits(), Relaxed);
        }
        if prefill_us >= 0 {
            r.utilisation.observe(
                now,
                &UtilSample {
                    prefill_busy_us: prefill_us,
                    moments: decode_moments(snap),
                    max_running,
                    pool_tokens: pool,
                    used_tokens: used,
                    running,
                    waiting,
                    backlog,
                },
            );
            r.rho_bits.store(r.utilisation.rho_bits(), Relaxed);
        }
        if let Some((field, max)) = out_of_range {
            self.refusals
                .refuse(Refusal::NumberOutOfRange, || match max {
                    0 => format!("rank {rank}: {field}: expected cumulative counters >= 0"),
                    _ => format!("rank {rank}: {field}: expected 0..={max} (clamped)"),
                });
        }
        r.dispatch_mark
            .store(self.dispatched.load(Relaxed), Relaxed);
        r.tokens_mark
            .store(self.dispatched_tokens.load(Relaxed), Relaxed);
        let routed = &r.routed;
        routed
            .dispatch_mark
            .store(routed.dispatched.load(Relaxed), Relaxed);
        routed
            .tokens_mark
            .store(routed.dispatched_tokens.load(Relaxed), Relaxed);
        r.received_ms.store(now.max(1), Relaxed);
        self.aggregate();
        true
    }

    fn refuse_rank(&self, e: RankOutOfRange) {
        self.refusals.refuse(Refusal::RankOutOfRange, || {
            format!(
                "rank {} is not below the bound {} (the advertised dp_size, else --max-ranks)",
                e.rank, e.bound
            )
        });
    }

    fn aggregate(&self) {
        let (mut e, mut tokens, mut oldest, mut mark, mut backlog) =
            (0i64, 0i64, u64::MAX, u64::MAX, 0i64);
        let (mut tokens_mark, mut tokens_per_us, mut kv_usage) = (u64::MAX, 0.0f64, 0.0f64);
        let (mut rho_sum, mut rho_known, mut n) = (0.0f64, true, 0usize);
        let mut pool_free = Some(u64::MAX);
        // Each rank's numbers are clamped on the way in; saturate anyway, the sums are cheap.
        for r in self.ranks.iter() {
            backlog = backlog.saturating_add(r.backlog.load(Relaxed));
            e = e.saturating_add(r.requests.load(Relaxed));
            tokens = tokens.saturating_add(r.tokens.load(Relaxed));
            oldest = oldest.min(r.received_ms.load(Relaxed));
            mark = mark.min(r.dispatch_mark.load(Relaxed));
            tokens_mark = tokens_mark.min(r.tokens_mark.load(Relaxed));
            tokens_per_us += 1.0 / r.prefill.us_per_token().unwrap_or(PRIOR_US_PER_TOKEN);
            kv_usage = kv_usage.max(f64::from_bits(r.token_usage_bits.load(Relaxed)));
            match r.rho() {
                Some(rho) => rho_sum += rho,
                None => rho_known = false,
            }
            n += 1;
            pool_free = pool_free.zip(r.pool_free()).map(|(a, b)| a.min(b));
        }
        // Receive time last: a reader that sees it fresh sees the sums that go with it.
        self.agg_requests.store(e, Relaxed);
        self.agg_tokens.store(tokens, Relaxed);
        self.agg_backlog.store(backlog, Relaxed);
        self.agg_mark.store(mark, Relaxed);
        self.agg_tokens_mark.store(tokens_mark, Relaxed);
        if tokens_per_us > 0.0 {
            self.agg_us_per_token_bits
                .store((1.0 / tokens_per_us).to_bits(), Relaxed);
        }
        self.agg_kv_usage_bits.store(kv_usage.to_bits(), Relaxed);
        // Ranks of one worker are one model on like hardware: equal capacities, a plain mean.
        let rho = match (rho_known, n) {
            (true, 1..) => (rho_sum / n as f64).to_bits(),
            _ => super::utilisation::RHO_NONE_BITS,
        };
        self.agg_rho_bits.store(rho, Relaxed);
        let pool_free = pool_free.filter(|_| n > 0);
        self.agg_pool_free
            .store(pool_free.unwrap_or(super::ranks::POOL_UNKNOWN), Relaxed);
        self.agg_oldest_rx
            .store(oldest, std::sync::atomic::Ordering::Release);
    }
}

/// A snapshot's decode moments, when it carries the six SGLang declares (any other length is a
/// different format: ignored, ρ then rests on prefill time alone).
fn decode_moments(snap: &LoadSnapshot) -> Option<[f64; 6]> {
    snap.decode_moments
        .as_deref()
        .and_then(|m| <[f64; 6]>::try_from(m).ok())
}
