//! An engine rank's utilisation ρ: the share of its *full-batch capacity* in use, smoothed over
//! the engine's own rate window.
//!
//! Why not the snapshot's `utilization`: under continuous batching an engine is busy whenever
//! anything runs, so its busy share reads ≈ 1 at any load. What a router needs to price one more
//! request's work is how close the engine is to what it can sustain, and an engine sustains the
//! most at a full batch. So ρ counts work at full-batch cost:
//!
//! ```text
//! ρ_sample = (Δ prefill busy µs + Δ decode tokens × d) / Δ wall µs,   clamped to [0, 1]
//! d        = α / B + β   (µs per decode token at a full batch of B requests)
//! ```
//! where the full batch B is the most requests the engine can hold at once: its slot bound
//! `max_running_requests`, or as many of its running requests' mean KV footprint
//! (`num_used_tokens / num_running_reqs`) as its pool (`max_total_num_tokens`) holds, whichever
//! is fewer (SGLang's default slot bound is often far above what its pool holds).
//! with the decode step's cost `t = α + β·b` fitted by least squares on the cumulative moments
//! SGLang 0.5.23 publishes (`decode_moments` = n, Σb, Σt_us, Σb², Σb·t_us, Σg; one batch size
//! only: `d = Σt/Σb`). That is the capacity the bench calibrates offered load on (a mean prompt's
//! prefill plus its output at the full-batch step cost), so a cache-blind fleet at load 0.8 reads
//! ρ ≈ 0.8.
//!
//! * **Windows** of at least [`RHO_WINDOW_MS`] of *receive* time (the caller's `now_ms`, so the
//!   simulator drives the meter in virtual time) make one sample; shorter gaps only accumulate.
//! * **Saturation whatever the bottleneck** (slots, KV, compute): when requests waited at every
//!   snapshot of a window and the prefill backlog did not shrink, the queue is not draining and the
//!   sample is 1.
//! * **Smoothing**: an exponentially weighted mean with weight `1 − e^{−Δt/τ}`, τ =
//!   [`RHO_TAU_MS`] (the engine's own throughput window), so uneven windows weigh by their length.
//! * **Cap** ρ ≤ B/(B+1): the mean number in an M/M/1 system, ρ/(1−ρ), then stays within one full
//!   batch, so a price built on it stays finite under overload.
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
    /// Prefill busy time and decode moments at full-batch cost.
    Capacity = 1,
    /// Batch occupancy (running requests ÷ the full batch): no counters.
    Slots = 2,
}

impl UtilSource {
    pub fn as_str(self) -> &'static str {
        match self {
            UtilSource::Unknown => "unknown",
            UtilSource::Capacity => "capacity",
            UtilSource::Slots => "slots",
        }
    }
}

/// µs per decode token at a full batch of `b` from cumulative decode `moments`: the fitted step
/// cost α + β·b spread over `b` tokens; the mean cost per token when every step had one batch
/// size (or the fit is not usable). `None` without a decode step, or for numbers that are not
/// finite and positive (they come from a peer).
pub fn full_batch_us_per_token(m: &[f64; 6], b: f64) -> Option<f64> {
    let [n, sb, st, sbb, sbt, _] = *m;
    if !m.iter().all(|x| x.is_finite()) || n < 1.0 || sb <= 0.0 || st <= 0.0 || b < 1.0 {
        return None;
    }
    let mean = st / sb;
    let den = n * sbb - sb * sb;
    // Relative to Σb²·n: rounding leaves a residue of that order when every b was equal.
    if den <= 1e-9 * n * sbb {
        return Some(mean);
    }
    let beta = (n * sbt - sb * st) / den;
    let alpha = (st - beta * sb) / n;
    let d = alpha / b + beta;
    Some(if d.is_finite() && d > 0.0 { d } else { mean })
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
            let decode_us = match (s.moments, batch) {
                (Some(m), Some(b)) => full_batch_us_per_token(&m, b)
                    .map_or(0.0, |d| (g - f64::from_bits(self.base_g.load(Relaxed))) * d),
                _ => 0.0,
            };
            Some((
                UtilSource::Capacity,
                (busy + decode_us) / (dt_ms as f64 * 1000.0),
            ))
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
            1 => UtilSource::Capacity,
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

/// The full batch a full-batch cost is taken at: the fewer of the published slot bound and the
/// running requests' mean KV footprint as many times as the pool holds it (see the module docs);
/// without a slot bound, the batch an average decoded token ran in (Σb²/Σb), from the moments.
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
