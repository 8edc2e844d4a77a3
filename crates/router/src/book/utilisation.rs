//! An engine rank's utilisation ρ: the share of its time its prefill is busy, smoothed over the
//! engine's own rate window; saturated when its queue does not drain.
//!
//! Why prefill: ρ prices what one more request's work costs the others' *first tokens* (the fleet
//! term, `policy::fleet_cost`). A new request's first token waits for the prefill ahead of it,
//! which the engine schedules before decode (SGLang runs a prefill batch whenever one is ready);
//! decode steps slow the tokens after the first, not the first. So the queue a recompute lengthens
//! is the prefill queue, and its utilisation is the prefill share of wall time:
//!
//! ```text
//! ρ_sample = Δ prefill busy µs / Δ wall µs,   clamped to [0, 1]
//! ```
//! What decode does to first tokens goes through slots and the KV pool: when the running batch
//! is full, requests wait although prefill is idle. That is the saturation rule below, which sees
//! it whatever the bottleneck. Until the seventh session of issue 24 ρ also counted decode tokens
//! at the full-batch step cost (fitted on `decode_moments`); with an engine model that publishes a
//! running request's prompt once it is prefilled, as SGLang does, that heavier ρ bought nothing on
//! long agentic sessions and kept generated-shared-prefix requests on busy holders for seconds
//! (docs/results.md, "The engine model was wrong").
//! Not the snapshot's `utilization`, which reads ≈ 1 at any load under continuous batching.
//!
//! * **Windows** of at least [`RHO_WINDOW_MS`] of *receive* time (the caller's `now_ms`, so the
//!   simulator drives the meter in virtual time) make one sample; shorter gaps only accumulate.
//! * **Saturation whatever the bottleneck** (slots, KV, compute): when requests waited at every
//!   snapshot of a window and the prefill backlog did not shrink, the queue is not draining and the
//!   sample is 1.
//! * **Smoothing**: an exponentially weighted mean with weight `1 − e^{−Δt/τ}`, τ =
//!   [`RHO_TAU_MS`] (the engine's own throughput window), so uneven windows weigh by their length.
//! * **Cap** ρ ≤ B/(B+1), B the most requests the engine holds at once (its slot bound
//!   `max_running_requests`, or as many of its running requests' mean KV footprint as its pool
//!   holds, whichever is fewer): the mean number in an M/M/1 system, ρ/(1−ρ), then stays within
//!   one batch, so a price built on it stays finite under overload.
//! * **Restarts** (a counter going back) move the baseline and keep the estimate, as
//!   [`super::prefill_rate::PrefillRate`] does.
//! * **Without the counters** (vLLM, older SGLang: no moments and no prefill busy time) ρ is the
//!   batch occupancy `running / B`; without a slot bound or pool figures, ρ stays unknown.
//!
//! One writer (the rank's subscriber thread, or the simulator) and any number of readers: every
//! field is an atomic, so the request path reads ρ without locks or allocation.

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering::Relaxed};

/// τ of the smoothing: SGLang's (and the loadlink engine's) throughput window, 5 s.
pub const RHO_TAU_MS: u64 = 5000;
/// Receive time one sample spans at least: τ/5, five samples per time constant.
pub const RHO_WINDOW_MS: u64 = 1000;

/// f64 bits that mean "no estimate" (a NaN no computation here produces).
const NONE_BITS: u64 = u64::MAX;

/// The counters of one snapshot the meter reads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UtilSample {
    /// Cumulative prefill busy time, µs (`total_prefill_busy_us`).
    pub prefill_busy_us: i64,
    /// Cumulative decode moments (`decode_moments`): n, Σb, Σt_us, Σb², Σb·t_us, Σg.
    pub moments: Option<[f64; 6]>,
    /// The rank's batch bound (`max_running_requests`; ≤ 0: unknown).
    pub max_running: i64,
    /// KV pool size and tokens in use (`max_total_num_tokens`, `num_used_tokens`; ≤ 0: unknown).
    pub pool_tokens: i64,
    pub used_tokens: i64,
    pub running: i64,
    pub waiting: i64,
    /// Prompt tokens waiting for prefill (`num_waiting_uncached_tokens`).
    pub backlog: i64,
}

/// What ρ was measured from (shown in `/workers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum UtilSource {
    /// Not measured yet.
    Unknown = 0,
    /// Prefill busy time.
    Prefill = 1,
    /// Batch occupancy (running requests ÷ the batch bound): no counters.
    Slots = 2,
}

impl UtilSource {
    pub fn as_str(self) -> &'static str {
        match self {
            UtilSource::Unknown => "unknown",
            UtilSource::Prefill => "prefill",
            UtilSource::Slots => "slots",
        }
    }
}

/// One rank's utilisation meter.
#[derive(Debug)]
pub struct Utilisation {
    /// Receive time the open window began, ms; 0: no window yet.
    base_ms: AtomicU64,
    base_busy_us: AtomicI64,
    /// f64 bits of Σg and n at the window's start.
    base_g: AtomicU64,
    base_n: AtomicU64,
    base_backlog: AtomicI64,
    /// The fewest waiting requests any snapshot of the open window reported.
    min_waiting: AtomicI64,
    /// f64 bits of the running mean, uncapped; [`NONE_BITS`] before the first sample.
    ewma_bits: AtomicU64,
    /// f64 bits of ρ as read (the mean, capped); [`NONE_BITS`] before the first sample.
    rho_bits: AtomicU64,
    source: AtomicU8,
    samples: AtomicU64,
}

impl Default for Utilisation {
    fn default() -> Self {
        Utilisation {
            base_ms: AtomicU64::new(0),
            base_busy_us: AtomicI64::new(0),
            base_g: AtomicU64::new(0),
            base_n: AtomicU64::new(0),
            base_backlog: AtomicI64::new(0),
            min_waiting: AtomicI64::new(0),
            ewma_bits: AtomicU64::new(NONE_BITS),
            rho_bits: AtomicU64::new(NONE_BITS),
            source: AtomicU8::new(UtilSource::Unknown as u8),
            samples: AtomicU64::new(0),
        }
    }
}

impl Utilisation {
    /// Feeds one snapshot's counters, received at `now_ms`.
    pub fn observe(&self, now_ms: u64, s: &UtilSample) {
        let (n, g) = s.moments.map_or((0.0, 0.0), |m| (m[0], m[5]));
        let base_ms = self.base_ms.load(Relaxed);
        let restarted = s.prefill_busy_us < self.base_busy_us.load(Relaxed)
            || n < f64::from_bits(self.base_n.load(Relaxed))
            || g < f64::from_bits(self.base_g.load(Relaxed))
            || !(n.is_finite() && g.is_finite());
        if base_ms == 0 || restarted || now_ms < base_ms {
            return self.rebase(now_ms, s, n, g);
        }
        let min_waiting = self.min_waiting.load(Relaxed).min(s.waiting);
        self.min_waiting.store(min_waiting, Relaxed);
        let dt_ms = now_ms - base_ms;
        if dt_ms < RHO_WINDOW_MS {
            return;
        }
        let batch = batch_bound(s);
        let sample = if s.moments.is_some() || s.prefill_busy_us > 0 {
            let busy = (s.prefill_busy_us - self.base_busy_us.load(Relaxed)) as f64;
            Some((UtilSource::Prefill, busy / (dt_ms as f64 * 1000.0)))
        } else {
            batch.map(|b| (UtilSource::Slots, s.running as f64 / b))
        };
        let not_draining = min_waiting > 0 && s.backlog >= self.base_backlog.load(Relaxed);
        self.rebase(now_ms, s, n, g);
        let Some((source, sample)) = sample else {
            return;
        };
        let sample = if not_draining { 1.0 } else { sample };
        let sample = if sample.is_finite() {
            sample.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let old = self.ewma_bits.load(Relaxed);
        let ewma = if old == NONE_BITS {
            sample
        } else {
            let w = 1.0 - (-(dt_ms as f64) / RHO_TAU_MS as f64).exp();
            let old = f64::from_bits(old);
            old + w * (sample - old)
        };
        self.ewma_bits.store(ewma.to_bits(), Relaxed);
        let b = batch.unwrap_or(1.0);
        self.rho_bits
            .store(ewma.min(b / (b + 1.0)).to_bits(), Relaxed);
        self.source.store(source as u8, Relaxed);
        self.samples.fetch_add(1, Relaxed);
    }

    fn rebase(&self, now_ms: u64, s: &UtilSample, n: f64, g: f64) {
        self.base_ms.store(now_ms.max(1), Relaxed);
        self.base_busy_us.store(s.prefill_busy_us, Relaxed);
        let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
        self.base_n.store(finite(n).to_bits(), Relaxed);
        self.base_g.store(finite(g).to_bits(), Relaxed);
        self.base_backlog.store(s.backlog, Relaxed);
        self.min_waiting.store(s.waiting, Relaxed);
    }

    /// ρ in [0, B/(B+1)], `None` before the first sample.
    #[inline]
    pub fn rho(&self) -> Option<f64> {
        rho_of_bits(self.rho_bits.load(Relaxed))
    }

    /// f64 bits of [`Utilisation::rho`] ([`u64::MAX`]: none), to copy beside a rank's hot figures.
    #[inline]
    pub fn rho_bits(&self) -> u64 {
        self.rho_bits.load(Relaxed)
    }

    /// What the estimate was last measured from.
    pub fn source(&self) -> UtilSource {
        match self.source.load(Relaxed) {
            1 => UtilSource::Prefill,
            2 => UtilSource::Slots,
            _ => UtilSource::Unknown,
        }
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(Relaxed)
    }
}

/// ρ from bits as [`Utilisation::rho_bits`] stores them.
#[inline]
pub fn rho_of_bits(bits: u64) -> Option<f64> {
    (bits != NONE_BITS).then(|| f64::from_bits(bits))
}

/// The bits that mean "no ρ".
pub const RHO_NONE_BITS: u64 = NONE_BITS;

/// The most requests the engine holds at once: the fewer of the published slot bound and the
/// running requests' mean KV footprint as many times as the pool holds it; without a slot bound,
/// the batch an average decoded token ran in (Σb²/Σb), from the moments.
fn batch_bound(s: &UtilSample) -> Option<f64> {
    let slots = if s.max_running > 0 {
        Some(s.max_running as f64)
    } else {
        s.moments
            .filter(|m| m[1] > 0.0 && m[3].is_finite() && m[3] >= m[1])
            .map(|m| m[3] / m[1])
    };
    let fits = (s.pool_tokens > 0 && s.running > 0 && s.used_tokens > 0)
        .then(|| s.pool_tokens as f64 * s.running as f64 / s.used_tokens as f64);
    match (slots, fits) {
        (Some(a), Some(b)) => Some(a.min(b).max(1.0)),
        (a, b) => a.or(b).map(|x| x.max(1.0)),
    }
}

#[cfg(test)]
#[path = "utilisation_tests.rs"]
mod tests;
