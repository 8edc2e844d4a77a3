//! LoRA adapters in the scheduler: which adapters are resident, when one is loaded and what the
//! load costs.
//!
//! SGLang serves many adapters on one base model but keeps only a few of them in GPU memory at
//! once (`--max-loaded-loras`, `--max-loras-per-batch`). Where load is concerned that has three
//! consequences, and they are what this models:
//!
//! * a request whose adapter is not resident cannot run until it is loaded, and a load is
//!   synchronous: the batch waits for it, so the request's first token (and every request in the
//!   same step) is later by the load time;
//! * loading evicts the least recently used resident adapter, but never one a running request
//!   uses; when every resident adapter is in use the request waits in the queue (skipped, as
//!   SGLang's scheduler skips it: requests behind it with a resident adapter, or none, still run);
//! * a router that sends an adapter's requests where it is already resident saves the loads.
//!
//! An adapter is an index into the engine's adapter table; the scheduler needs no names.

use super::{Req, Scheduler};

/// The LoRA side of the model (off by default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoraConfig {
    /// Adapters resident at once; 0: LoRA off (a request's adapter is ignored).
    pub max_loaded: usize,
    /// Seconds one load takes on the scheduler's clock (the batch pauses for it).
    pub load_time_s: f64,
}

/// The resident adapters and the loads so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Adapters {
    /// Resident adapters with the tick of their last admission (the recency order).
    resident: Vec<(u32, u64)>,
    tick: u64,
    loads: u64,
}

/// What running a request's adapter takes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Residency {
    /// No adapter, LoRA off, or already resident.
    Ready,
    /// A load, into a free slot or in place of this idle adapter.
    Load { evict: Option<u32> },
    /// Every slot holds an adapter some admitted request uses.
    Wait,
}

impl Scheduler {
    /// Adapter loads since start.
    pub fn adapter_loads(&self) -> u64 {
        self.adapters.loads
    }

    /// How many adapters are resident (no allocation: read after every step).
    pub fn resident_count(&self) -> usize {
        self.adapters.resident.len()
    }

    /// The resident adapters, least recently used first.
    pub fn resident_adapters(&self) -> Vec<u32> {
        let mut r = self.adapters.resident.clone();
        r.sort_unstable_by_key(|&(_, tick)| tick);
        r.into_iter().map(|(a, _)| a).collect()
    }

    /// Whether an admitted request (running, being chunked, or in this step's `batch`) uses
    /// adapter `a`.
    fn adapter_in_use(&self, a: u32, batch: &[Req]) -> bool {
        let uses = |r: &Req| r.adapter == Some(a);
        self.running.iter().any(uses) || self.chunked.iter().any(uses) || batch.iter().any(uses)
    }

    fn residency(&self, req: &Req, batch: &[Req]) -> Residency {
        let Some(a) = req.adapter.filter(|_| self.cfg.lora.max_loaded > 0) else {
            return Residency::Ready;
        };
        let ads = &self.adapters;
        if ads.resident.iter().any(|&(r, _)| r == a) {
            return Residency::Ready;
        }
        if ads.resident.len() < self.cfg.lora.max_loaded {
            return Residency::Load { evict: None };
        }
        ads.resident
            .iter()
            .filter(|&&(r, _)| !self.adapter_in_use(r, batch))
            .min_by_key(|&&(_, tick)| tick)
            .map_or(Residency::Wait, |&(r, _)| Residency::Load {
                evict: Some(r),
            })
    }

    /// The position in the queue of the first request whose adapter can be made resident now
    /// (the front one when LoRA is off).
    pub(super) fn next_runnable(&self, batch: &[Req]) -> Option<usize> {
        if self.cfg.lora.max_loaded == 0 {
            return (!self.waiting.is_empty()).then_some(0);
        }
        self.waiting
            .iter()
            .position(|r| self.residency(r, batch) != Residency::Wait)
    }

    /// Makes an admitted request's adapter resident (evicting the least recently used idle one
    /// when the slots are full) and marks it used; returns the load time it cost, in µs.
    pub(super) fn use_adapter(&mut self, req: &Req, batch: &[Req]) -> f64 {
        let residency = self.residency(req, batch);
        let Some(a) = req.adapter.filter(|_| self.cfg.lora.max_loaded > 0) else {
            return 0.0;
        };
        let ads = &mut self.adapters;
        ads.tick += 1;
        let tick = ads.tick;
        match residency {
            Residency::Ready => {
                if let Some(slot) = ads.resident.iter_mut().find(|(r, _)| *r == a) {
                    slot.1 = tick;
                }
                0.0
            }
            Residency::Load { evict } => {
                ads.resident.retain(|&(r, _)| Some(r) != evict);
                ads.resident.push((a, tick));
                ads.loads += 1;
                self.cfg.lora.load_time_s.max(0.0) * 1e6
            }
            // `next_runnable` chose the request: unreachable, and harmless (no load, no cost).
            Residency::Wait => 0.0,
        }
    }
}
