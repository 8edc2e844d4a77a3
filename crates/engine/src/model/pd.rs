//! Prefill–decode disaggregation in the scheduler model: the queues a request waits in while its
//! KV moves between engines, and what they count in the load.
//!
//! * A prefill engine's request ([`Disagg::Prefill`]) is prefilled as usual (prefix cache, KV
//!   events); its prefill then emits its first token and its KV stays held in the **transfer**
//!   queue (SGLang's "inflight" queue) until [`Scheduler::finish_transfer`]: only then is it
//!   finished, with that one token, and its prompt cached. Until its decode side has registered
//!   ([`Scheduler::peer_registered`]) it also counts in the **bootstrap** queue.
//! * A decode engine's request ([`Disagg::Decode`]) holds no KV while it waits for the transfer
//!   (**awaiting**); [`Scheduler::kv_arrived`] moves it to **arrived**, from where the next step
//!   admits it straight into the running batch when the batch and the pool have room (its prompt
//!   then counts in KV usage; no prefill compute), announcing its first token (computed by the
//!   prefill engine) with that step.
//!
//! The sockets, the timers and the room ids live outside ([`crate::pd`]); the model sees ids.

use super::{Disagg, Event, Req, Scheduler};
use loadlink_wire::snapshot::DisaggregationMetrics;
use std::collections::VecDeque;

/// An engine's role in prefill–decode disaggregation (`--disaggregation-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PdMode {
    /// Not disaggregated (SGLang's `"null"`).
    #[default]
    Null,
    Prefill,
    Decode,
}

impl PdMode {
    /// SGLang's spelling (`/server_info`'s `disaggregation_mode`, the snapshot's `mode`).
    pub fn as_str(self) -> &'static str {
        match self {
            PdMode::Null => "null",
            PdMode::Prefill => "prefill",
            PdMode::Decode => "decode",
        }
    }

    /// Parses `null`, `prefill` or `decode`.
    pub fn parse(s: &str) -> Result<PdMode, String> {
        match s {
            "null" => Ok(PdMode::Null),
            "prefill" => Ok(PdMode::Prefill),
            "decode" => Ok(PdMode::Decode),
            _ => Err(format!("expected null, prefill or decode, got {s:?}")),
        }
    }
}

/// The disaggregation queues and the link's figures.
#[derive(Debug, Clone, Default)]
pub(super) struct PdQueues {
    pub(super) mode: PdMode,
    /// Prefilled requests holding their KV until it has been sent.
    pub(super) transfer: Vec<Req>,
    /// Decode requests waiting (without KV) for their KV to arrive.
    pub(super) awaiting: Vec<Req>,
    /// Decode requests whose KV arrived, waiting for batch and pool room.
    pub(super) arrived: VecDeque<Req>,
    /// The configured link bandwidth and the last transfer's latency.
    link_gb_s: f64,
    last_latency_ms: f64,
}

impl PdQueues {
    /// Takes request `id` out of whichever disaggregation queue holds it.
    pub(super) fn remove(&mut self, id: u64) -> Option<Req> {
        if let Some(i) = self.transfer.iter().position(|r| r.id == id) {
            return Some(self.transfer.swap_remove(i));
        }
        if let Some(i) = self.awaiting.iter().position(|r| r.id == id) {
            return Some(self.awaiting.swap_remove(i));
        }
        let i = self.arrived.iter().position(|r| r.id == id)?;
        self.arrived.remove(i)
    }
}

impl Scheduler {
    /// Sets this rank's role and its link's bandwidth (GB/s), which its load reports.
    pub fn set_disaggregation(&mut self, mode: PdMode, link_gb_s: f64) {
        self.pd.mode = mode;
        self.pd.link_gb_s = link_gb_s;
    }

    /// The decode side of prefill request `id` registered for its KV (it leaves the bootstrap
    /// queue). Returns whether the request is known.
    pub fn peer_registered(&mut self, id: u64) -> bool {
        let queued = self.waiting.iter_mut().chain(self.chunked.as_mut());
        let found = queued
            .chain(self.pd.transfer.iter_mut())
            .find(|r| r.id == id);
        found.map(|r| r.registered = true).is_some()
    }

    /// Whether prefill request `id` is prefilled and its KV waits for the transfer.
    pub fn is_transferring(&self, id: u64) -> bool {
        self.pd.transfer.iter().any(|r| r.id == id)
    }

    /// Prefill request `id`'s KV has been sent (`latency_s` after its prefill ended): it
    /// finishes with its one token, its prompt is cached and its KV freed. `None` when it is not
    /// in the transfer queue.
    pub fn finish_transfer(&mut self, id: u64, latency_s: f64) -> Option<Event> {
        let i = self.pd.transfer.iter().position(|r| r.id == id)?;
        let req = self.pd.transfer.swap_remove(i);
        self.pd.last_latency_ms = latency_s * 1e3;
        let done = Event::Finished {
            id,
            prompt_tokens: req.prompt,
            completion_tokens: req.generated.max(1),
        };
        self.finish(req);
        Some(done)
    }

    /// Decode request `id`'s KV has arrived (`latency_s` after it was asked for): the next step
    /// admits it when there is room. Returns whether it was waiting.
    pub fn kv_arrived(&mut self, id: u64, latency_s: f64) -> bool {
        let Some(i) = self.pd.awaiting.iter().position(|r| r.id == id) else {
            return false;
        };
        let req = self.pd.awaiting.swap_remove(i);
        self.pd.last_latency_ms = latency_s * 1e3;
        self.pd.arrived.push_back(req);
        true
    }

    /// Admits arrived decode requests, first come first served, while the batch and the pool
    /// have room (the first one always, into an empty batch, so a huge prompt cannot wedge the
    /// queue). Each starts with its prompt in KV and its first token generated.
    pub(super) fn admit_arrived(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(req) = self.pd.arrived.front() {
            let need = req.prompt + self.reservation(req);
            let batch_full = self.running.len() >= self.cfg.max_running_requests;
            let fits =
                self.used_tokens() + self.reserved_tokens() + need <= self.cfg.max_total_tokens;
            if !self.running.is_empty() && (batch_full || !fits) {
                break;
            }
            let Some(mut req) = self.pd.arrived.pop_front() else {
                break;
            };
            self.make_room(req.prompt);
            (req.prefilled, req.generated) = (req.prompt, 1);
            self.record_hit(0, req.prompt);
            events.push(Event::FirstToken { id: req.id });
            self.finish_or_run(req, &mut events);
        }
        events
    }

    /// The snapshot's `disaggregation` section (`None` when not disaggregated). Prefill:
    /// bootstrap = its requests whose decode side has not registered, inflight = prefilled ones
    /// whose KV is being sent. Decode: transfer = waiting for their KV, prealloc = KV arrived,
    /// waiting for room.
    pub(super) fn disaggregation_metrics(&self) -> Option<DisaggregationMetrics> {
        if self.pd.mode == PdMode::Null {
            return None;
        }
        let is_prefill = |r: &&Req| r.disagg == Disagg::Prefill;
        let unregistered = self
            .waiting
            .iter()
            .chain(self.chunked.as_ref())
            .chain(&self.pd.transfer)
            .filter(is_prefill)
            .filter(|r| !r.registered)
            .count();
        let inflight = self.pd.transfer.iter().filter(|r| r.registered).count();
        Some(DisaggregationMetrics {
            mode: self.pd.mode.as_str().to_string(),
            prefill_bootstrap_queue_reqs: unregistered as i64,
            prefill_inflight_queue_reqs: inflight as i64,
            decode_prealloc_queue_reqs: self.pd.arrived.len() as i64,
            decode_transfer_queue_reqs: self.pd.awaiting.len() as i64,
            decode_retracted_queue_reqs: self.waiting.iter().filter(|r| r.retracted).count() as i64,
            kv_transfer_speed_gb_s: self.pd.link_gb_s,
            kv_transfer_latency_ms: self.pd.last_latency_ms,
        })
    }
}
