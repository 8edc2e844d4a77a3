//! What a PD router counts, and the `loadlink_pd_…` families of `/metrics`: per side (`role`
//! label) the workers, their open requests and dispatches; the requests by outcome; prefill
//! failures by kind; retries by the side that failed.

use super::Role;
use crate::state::AppState;
use loadlink_wire::prom::{Exposition, MetricType};
use loadlink_wire::snapshot::DisaggregationMetrics;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Requests a PD engine has accepted but not started on for want of KV (decode: pre-allocation
/// and transfer queues) or of its decode side (prefill: bootstrap and in-flight transfer queues),
/// from a snapshot's `disaggregation` section; 0 without one.
pub fn pending_transfers(d: Option<&DisaggregationMetrics>) -> i64 {
    let Some(d) = d else { return 0 };
    match d.mode.as_str() {
        "decode" => d
            .decode_prealloc_queue_reqs
            .saturating_add(d.decode_transfer_queue_reqs),
        "prefill" => d
            .prefill_bootstrap_queue_reqs
            .saturating_add(d.prefill_inflight_queue_reqs),
        _ => 0,
    }
}

/// How a PD request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The decode engine's answer reached the client (whatever its status).
    Decoded,
    /// A prefill 4xx, passed to the client.
    PrefillRefused,
    /// The prefill failed otherwise (error answer, cut stream, error event): the request failed.
    PrefillFailed,
    /// Every attempt failed to connect or got 502–504.
    Exhausted,
    /// Answered before any dispatch: a side without an available worker, a refusal by admission,
    /// or a request refused as read (its body, its model).
    NoPair,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Decoded,
        Outcome::PrefillRefused,
        Outcome::PrefillFailed,
        Outcome::Exhausted,
        Outcome::NoPair,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Decoded => "decoded",
            Outcome::PrefillRefused => "prefill_refused",
            Outcome::PrefillFailed => "prefill_failed",
            Outcome::Exhausted => "exhausted",
            Outcome::NoPair => "no_pair",
        }
    }
}

/// The PD counters.
#[derive(Debug, Default)]
pub struct PdMetrics {
    outcomes: [AtomicU64; Outcome::ALL.len()],
    /// Retries after a prefill failure, after a decode failure.
    retries: [AtomicU64; 2],
    /// Prefill failures that reached a client stream already open (ended with an error event).
    pub prefill_failed_mid_stream: AtomicU64,
    /// Dispatches per side (prefill, decode).
    dispatched: [AtomicU64; 2],
    /// Each side's pick sequence (the policies' entropy): one shared sequence would hand a side
    /// every other number, and `round_robin` would then visit half of that side.
    seqs: [AtomicU64; 2],
}

fn side(role: Role) -> usize {
    match role {
        Role::Decode => 1,
        _ => 0,
    }
}

impl PdMetrics {
    pub fn outcome(&self, o: Outcome) {
        self.outcomes[o as usize].fetch_add(1, Relaxed);
    }

    pub fn outcome_count(&self, o: Outcome) -> u64 {
        self.outcomes[o as usize].load(Relaxed)
    }

    /// A retry after `failed` failed.
    pub fn retry(&self, failed: Role) {
        self.retries[side(failed)].fetch_add(1, Relaxed);
    }

    /// The next entropy for a pick on `role`'s side.
    pub fn next_seq(&self, role: Role) -> u64 {
        self.seqs[side(role)].fetch_add(1, Relaxed)
    }

    pub fn dispatched(&self, role: Role) {
        self.dispatched[side(role)].fetch_add(1, Relaxed);
    }

    /// The `loadlink_pd_…` families (written only when the router runs `--pd`).
    pub fn write(&self, e: &mut Exposition, st: &AppState) {
        let roster = st.fleet.roster();
        let mut counts = [(0u64, 0i64); 3];
        for w in roster.workers.iter() {
            let c = &mut counts[w.pd.role() as usize];
            c.0 += 1;
            c.1 += w.inflight();
        }
        let roles = [Role::Prefill, Role::Decode, Role::Regular];
        let mut f = e.family(
            "loadlink_pd_workers",
            MetricType::Gauge,
            "Workers by PD role (regular workers take no PD request)",
        );
        for r in roles {
            f.sample(&[("role", r.as_str())], counts[r as usize].0);
        }
        let mut f = e.family(
            "loadlink_pd_inflight",
            MetricType::Gauge,
            "This router's open requests on each side",
        );
        for r in roles {
            f.sample(&[("role", r.as_str())], counts[r as usize].1.max(0) as u64);
        }
        let mut f = e.family(
            "loadlink_pd_dispatched_total",
            MetricType::Counter,
            "Legs dispatched, by side",
        );
        for r in [Role::Prefill, Role::Decode] {
            f.sample(
                &[("role", r.as_str())],
                self.dispatched[side(r)].load(Relaxed),
            );
        }
        let mut f = e.family(
            "loadlink_pd_requests_total",
            MetricType::Counter,
            "PD requests by outcome",
        );
        for o in Outcome::ALL {
            f.sample(&[("outcome", o.as_str())], self.outcome_count(o));
        }
        let mut f = e.family(
            "loadlink_pd_retries_total",
            MetricType::Counter,
            "Attempts retried with a new pair and room, by the side whose leg failed",
        );
        for r in [Role::Prefill, Role::Decode] {
            f.sample(&[("role", r.as_str())], self.retries[side(r)].load(Relaxed));
        }
        e.single(
            "loadlink_pd_prefill_failed_mid_stream_total",
            MetricType::Counter,
            "Prefill failures after the client's stream opened (ended with an SSE error event)",
            self.prefill_failed_mid_stream.load(Relaxed),
        );
    }
}
