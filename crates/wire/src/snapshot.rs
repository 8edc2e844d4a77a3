//! The two load payloads: `LoadSnapshot` (generation A, and the internal SHM/PUSH sinks) and
//! `LoadStat` (generation B, SGLang 0.5.23's router-facing gauge).
//!
//! Field order and defaults follow SGLang 0.5.23's declarations, because msgspec writes map keys in
//! declaration order and omits fields that still hold their default. Float scalars are
//! `Option<f64>`: msgspec omits a float only when it was never passed (identity with the default),
//! so "explicitly 0.0" and "absent" are different bytes on the wire and must be different values
//! here. Use the accessor methods (`token_usage()` …) to read them as plain numbers.

/// One core scalar of a snapshot, as the encoder and renderers see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Int(i64),
    /// `None`: never set (omitted on the wire, reads as 0.0).
    Float(Option<f64>),
}

impl Scalar {
    /// The value as a plain number (absent floats read as 0.0).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Float(v) => v.unwrap_or(0.0),
        }
    }
}

/// A mutable handle on one core scalar, used by the decoder to fill a field by key.
pub(crate) enum ScalarMut<'a> {
    Int(&'a mut i64),
    Float(&'a mut Option<f64>),
}

macro_rules! scalar_ty {
    (int) => { i64 };
    (float) => { Option<f64> };
}
macro_rules! scalar_val {
    (int, $e:expr) => {
        Scalar::Int($e)
    };
    (float, $e:expr) => {
        Scalar::Float($e)
    };
}
macro_rules! scalar_mut {
    (int, $e:expr) => {
        ScalarMut::Int($e)
    };
    (float, $e:expr) => {
        ScalarMut::Float($e)
    };
}

macro_rules! load_snapshot {
    ($( $(#[$doc:meta])* $name:ident : $kind:ident ),* $(,)?) => {
        /// Per-DP-rank load of one scheduler, as SGLang 0.5.23 declares it.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct LoadSnapshot {
            $( $(#[$doc])* pub $name: scalar_ty!($kind), )*
            /// Decode step-time moment sums: count, Σb, Σt_us, Σb², Σb·t_us, Σg.
            pub decode_moments: Option<Vec<f64>>,
            pub memory: Option<MemoryMetrics>,
            pub speculative: Option<SpeculativeMetrics>,
            pub lora: Option<LoraMetrics>,
            pub disaggregation: Option<DisaggregationMetrics>,
            pub queues: Option<QueueMetrics>,
        }

        /// The scalar keys, msgpack-encoded at compile time, in wire order.
        pub(crate) const CORE_KEY_BLOCKS: [crate::msgpack::KeyBlock; CORE_SCALARS.len()] =
            [$(crate::msgpack::key_block(stringify!($name))),*];

        /// The scalar field names in wire (declaration) order.
        pub const CORE_SCALARS: [&str; load_snapshot!(@count $($name)*)] = [$(stringify!($name)),*];

        impl LoadSnapshot {
            /// Every core scalar in wire order, with its name.
            pub fn core_scalars(&self) -> [(&'static str, Scalar); CORE_SCALARS.len()] {
                [$( (stringify!($name), scalar_val!($kind, self.$name)) ),*]
            }

            /// The `idx`-th core scalar (wire order), for the decoder.
            pub(crate) fn core_scalar_at(&mut self, idx: usize) -> Option<ScalarMut<'_>> {
                let mut i = 0usize;
                $( if idx == i { return Some(scalar_mut!($kind, &mut self.$name)); } i += 1; )*
                let _ = i;
                None
            }

            pub(crate) fn core_scalar_mut(&mut self, key: &[u8]) -> Option<(&'static str, ScalarMut<'_>)> {
                let idx = core_index(key, 0)?;
                Some((CORE_SCALARS[idx], self.core_scalar_at(idx)?))
            }
        }
    };
    (@count) => { 0 };
    (@count $head:ident $($tail:ident)*) => { 1 + load_snapshot!(@count $($tail)*) };
}

/// Index of `key` in [`CORE_SCALARS`], trying `hint` first: msgspec writes keys in declaration
/// order, so the decoder's next key is almost always the one after the last.
#[inline]
pub(crate) fn core_index(key: &[u8], hint: usize) -> Option<usize> {
    core_at(key, hint).or_else(|| {
        CORE_SCALARS
            .iter()
            .position(|n| short_eq(n.as_bytes(), key))
    })
}

/// `Some(i)` when `key` is the `i`-th core name.
#[inline]
pub(crate) fn core_at(key: &[u8], i: usize) -> Option<usize> {
    CORE_SCALARS
        .get(i)
        .is_some_and(|n| short_eq(n.as_bytes(), key))
        .then_some(i)
}

/// Equality of two short byte strings without a `memcmp` call: field names are under 32 bytes,
/// so comparing 8-byte words inline beats the call overhead.
#[inline(always)]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in (&mut ca).zip(&mut cb) {
        if u64::from_ne_bytes(x.try_into().unwrap_or_default())
            != u64::from_ne_bytes(y.try_into().unwrap_or_default())
        {
            return false;
        }
    }
    ca.remainder()
        .iter()
        .zip(cb.remainder())
        .all(|(x, y)| x == y)
}

load_snapshot! {
    /// Wall clock, seconds since the epoch.
    timestamp: float,
    dp_rank: int,
    num_running_reqs: int,
    num_waiting_reqs: int,
    num_waiting_uncached_tokens: int,
    num_used_tokens: int,
    num_total_tokens: int,
    /// `num_total_tokens` minus tokens still awaiting a KV transfer.
    num_active_tokens: int,
    num_prealloc_ready_tokens: int,
    max_total_num_tokens: int,
    max_running_requests: int,
    token_usage: float,
    gen_throughput: float,
    cache_hit_rate: float,
    utilization: float,
    /// Cumulative.
    total_prefill_uncached_tokens: int,
    /// Cumulative.
    total_prefill_busy_us: int,
}

impl LoadSnapshot {
    pub fn timestamp(&self) -> f64 {
        self.timestamp.unwrap_or(0.0)
    }
    pub fn token_usage(&self) -> f64 {
        self.token_usage.unwrap_or(0.0)
    }
    pub fn gen_throughput(&self) -> f64 {
        self.gen_throughput.unwrap_or(0.0)
    }
    pub fn cache_hit_rate(&self) -> f64 {
        self.cache_hit_rate.unwrap_or(0.0)
    }
    pub fn utilization(&self) -> f64 {
        self.utilization.unwrap_or(0.0)
    }
}

pub use crate::sections::{
    DisaggregationMetrics, FieldValue, LoraMetrics, MemoryMetrics, QueueMetrics, SpeculativeMetrics,
};

/// SGLang 0.5.23's generation-B gauge: a tagged array, always written in full.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadStat {
    pub num_running_reqs: i64,
    pub num_waiting_reqs: i64,
    /// KV tokens in use (the snapshot's `num_used_tokens`).
    pub num_tokens: i64,
    pub max_total_num_tokens: i64,
    /// Informational only; subscribers key by socket rank. May be nil on the wire.
    pub attn_dp_rank: Option<i64>,
    pub num_waiting_uncached_tokens: i64,
    pub num_total_tokens: i64,
    pub max_running_requests: i64,
    pub total_prefill_uncached_tokens: i64,
    pub total_prefill_busy_us: i64,
}

impl LoadStat {
    /// The stat SGLang's publisher derives from a snapshot for socket rank `rank`.
    pub fn from_snapshot(s: &LoadSnapshot, rank: i64) -> Self {
        LoadStat {
            num_running_reqs: s.num_running_reqs,
            num_waiting_reqs: s.num_waiting_reqs,
            num_tokens: s.num_used_tokens,
            max_total_num_tokens: s.max_total_num_tokens,
            attn_dp_rank: Some(rank),
            num_waiting_uncached_tokens: s.num_waiting_uncached_tokens,
            num_total_tokens: s.num_total_tokens,
            max_running_requests: s.max_running_requests,
            total_prefill_uncached_tokens: s.total_prefill_uncached_tokens,
            total_prefill_busy_us: s.total_prefill_busy_us,
        }
    }

    /// The same numbers as a (partial) snapshot, so one consumer path handles both generations.
    pub fn to_snapshot(&self) -> LoadSnapshot {
        LoadSnapshot {
            dp_rank: self.attn_dp_rank.unwrap_or(0),
            num_running_reqs: self.num_running_reqs,
            num_waiting_reqs: self.num_waiting_reqs,
            num_used_tokens: self.num_tokens,
            max_total_num_tokens: self.max_total_num_tokens,
            num_waiting_uncached_tokens: self.num_waiting_uncached_tokens,
            num_total_tokens: self.num_total_tokens,
            max_running_requests: self.max_running_requests,
            total_prefill_uncached_tokens: self.total_prefill_uncached_tokens,
            total_prefill_busy_us: self.total_prefill_busy_us,
            ..LoadSnapshot::default()
        }
    }
}
