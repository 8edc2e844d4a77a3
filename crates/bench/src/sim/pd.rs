//! Prefill–decode disaggregation in the simulator: a fleet whose first engines only prefill and
//! whose others only decode, with the KV of each prompt moved between them over a link.
//!
//! A routed request is placed twice by its router replica, as `loadlink route --pd` does: a prefill
//! engine by the variant's (production) policy over the prefill engines, with the request's cached
//! prefix on each; a decode engine by the decode policy ([`DecodePolicy`]) over the decode engines.
//! Then, in virtual time:
//!
//! 1. **Prefill**: the prefill engine's scheduler (the production model with its prefix cache and
//!    KV events, in prefill mode) runs the prompt; its decode side registers at once. The
//!    prefilled request then holds its KV in the engine's transfer queue.
//! 2. **Transfer**: the prompt's KV (`prompt tokens × bytes per token`) crosses the link of that
//!    (prefill, decode) pair at the link's bandwidth ([`KvLink`]); a pair's link moves one transfer
//!    at a time, so transfers queue behind each other (the transfer wait counts both). When it has
//!    crossed, the prefill engine frees the KV and answers; the prefill guard ends there, as the
//!    router's does when the prefill answer ends.
//! 3. **Decode**: the decode engine's scheduler (decode mode) has held the request since dispatch
//!    without KV; on the KV's arrival its next step admits it straight into the running batch (its
//!    prompt in KV usage, no prefill compute) and announces its first token with that step. So a PD
//!    request's TTFT is prefill queue + prefill + transfer + first decode step.
//!
//! Direct (router-bypassing) requests pick both engines uniformly, as a client pairing engines on
//! its own would. PD fleets route whole engines (one rank each); admission control and the
//! clairvoyant router are not modelled for them.

use super::events::Ev;
use super::{Sim, SimConfig, ms};
use loadlink_engine::PdMode;
use loadlink_engine::model::{Disagg, Event, ModelConfig, Scheduler, StepKind, Submit};
use loadlink_router::candidate::Candidate;
use loadlink_router::fleet_view::FleetView;
use loadlink_router::policy::{DecodeLoad, mix};
use loadlink_router::{InflightGuard, LoadSignal, Policy, Worker};
use std::sync::Arc;

/// How the routers pick a decode engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DecodePolicy {
    /// `loadlink route --pd`'s default: the router's `decode_load` (running + waiting requests,
    /// requests waiting for KV, KV pressure; in-flight when stale) on its default load signal.
    DecodeLoad,
    /// A production policy on a load signal (e.g. round robin, least in-flight).
    Policy(Policy, LoadSignal),
}

impl DecodePolicy {
    pub fn label(self) -> String {
        match self {
            DecodePolicy::DecodeLoad => "decode_load".into(),
            DecodePolicy::Policy(Policy::RoundRobin, _) => "round_robin".into(),
            DecodePolicy::Policy(Policy::LeastLoad, LoadSignal::Inflight) => {
                "least_inflight".into()
            }
            DecodePolicy::Policy(p, s) => format!("{} / {}", p.as_str(), s.as_str()),
        }
    }
}

/// The link each (prefill, decode) pair moves KV over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvLink {
    /// KV bytes per prompt token (`loadlink engine --kv-bytes-per-token`).
    pub bytes_per_token: u64,
    /// Gigabytes per second (`loadlink engine --kv-transfer-gb-s`).
    pub gb_s: f64,
}

impl KvLink {
    /// The engine's defaults: 131072 bytes per token at 25 GB/s.
    pub const DEFAULT: KvLink = KvLink {
        bytes_per_token: 131_072,
        gb_s: 25.0,
    };

    /// Seconds to move the KV of `tokens` prompt tokens.
    pub fn transfer_s(self, tokens: u64) -> f64 {
        tokens as f64 * self.bytes_per_token as f64 / (self.gb_s.max(1e-9) * 1e9)
    }
}

/// A disaggregated fleet: engines `0..prefill` prefill, the rest decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PdFleet {
    pub prefill: usize,
    pub decode_policy: DecodePolicy,
    pub link: KvLink,
}

/// The candidates the routers' (first) policy picks from: the prefill engines of a PD fleet, else
/// the fleet's list as its rank routing makes it.
pub(super) fn routed_candidates(cfg: &SimConfig, workers: &[Arc<Worker>]) -> Vec<Candidate> {
    match &cfg.pd {
        Some(f) => (0..f.prefill)
            .map(|w| Candidate {
                worker: w as u32,
                rank: None,
            })
            .collect(),
        None => cfg.rank_routing.candidates(workers),
    }
}

/// A PD request's timeline, in virtual seconds (what the tests and the report read).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PdTimeline {
    pub arrived: f64,
    /// The prefill engine produced its first token (its prefill ended).
    pub prefilled: f64,
    /// Its KV reached the decode engine.
    pub transferred: f64,
    /// The decode engine's first token: the client's first token.
    pub first: f64,
    pub done: f64,
    pub prefill_engine: usize,
    pub decode_engine: usize,
}

/// One request's PD state.
#[derive(Default)]
struct PdReq {
    /// The decode unit.
    decode: usize,
    /// When it was dispatched (the decode side asked for its KV then).
    dispatched: f64,
    prefilled: Option<f64>,
    transferred: Option<f64>,
    /// The decode side's in-flight guard (until the request finishes).
    guard: Option<InflightGuard>,
}

/// The simulator's PD state.
pub(super) struct PdState {
    fleet: PdFleet,
    decode_engines: usize,
    decode_list: Vec<Candidate>,
    reqs: Vec<PdReq>,
    /// Per (prefill engine × decode engines + decode index): when its link is free.
    link_free: Vec<f64>,
}

impl PdState {
    /// The state for `requests` requests on a fleet of `engines` engines.
    pub(super) fn new(fleet: PdFleet, engines: usize, requests: usize) -> Self {
        let decode_engines = engines.saturating_sub(fleet.prefill);
        PdState {
            fleet,
            decode_engines,
            decode_list: (fleet.prefill..engines)
                .map(|w| Candidate {
                    worker: w as u32,
                    rank: None,
                })
                .collect(),
            reqs: (0..requests).map(|_| PdReq::default()).collect(),
            link_free: vec![0.0; fleet.prefill * decode_engines],
        }
    }
}

impl Sim<'_> {
    /// Places PD request `i` arriving at `t` (prefill and decode engines) and starts its prefill;
    /// `false` when the fleet is not disaggregated.
    pub(super) fn arrive_pd(&mut self, i: usize, t: f64) -> bool {
        let Some(pd) = &self.pd else {
            return false;
        };
        let (np, nd) = (pd.fleet.prefill as u64, pd.decode_engines as u64);
        let mut submit = self.submit_of(i).with_disagg(Disagg::Prefill);
        submit.max_new_tokens = 1; // the prefill engine answers with the first token
        let (prefill, decode) = if self.arrivals[i].direct {
            let h = mix(i as u64 ^ 0xd1ec7);
            let p = Candidate {
                worker: (h % np.max(1)) as u32,
                rank: None,
            };
            let d = Candidate {
                worker: (np + (h >> 32) % nd.max(1)) as u32,
                rank: None,
            };
            (self.unit_for(p), self.unit_for(d))
        } else {
            let Some(prefill) = self.route(i, &submit, t, true) else {
                return true; // refused (counted) or nothing available
            };
            let Some(decode) = self.route_decode(i, t) else {
                self.reqs[i].guard = None;
                self.reject(i);
                return true;
            };
            (prefill, decode)
        };
        if let Some(pd) = &mut self.pd {
            (pd.reqs[i].decode, pd.reqs[i].dispatched) = (decode, t);
        }
        self.start(i, prefill, submit, t);
        // The decode side takes the request in (it waits without KV) and registers for the KV.
        self.engines[prefill].outside(t, |s| s.peer_registered(i as u64));
        let a = &self.arrivals[i];
        let held = Submit::counted(i as u64, a.prompt_tokens, a.output_tokens);
        let started = self.engines[decode].arrive(held.with_disagg(Disagg::Decode), t);
        self.advance(decode, t, started);
        true
    }

    /// The decode unit for routed request `i`, picked by its router replica's decode policy; holds
    /// the decode side's in-flight guard.
    fn route_decode(&mut self, i: usize, t: f64) -> Option<usize> {
        let pd = self.pd.as_ref()?;
        let r = i % self.cfg.routers;
        let (policy, signal) = match pd.fleet.decode_policy {
            DecodePolicy::DecodeLoad => (
                Policy::DecodeLoad(DecodeLoad::default()),
                LoadSignal::default(),
            ),
            DecodePolicy::Policy(p, s) => (p, s),
        };
        let mut view = FleetView::new(&self.books[r], signal, self.cfg.freshness_ms)
            .with_candidates(&pd.decode_list);
        view.now_ms = ms(t);
        let pick = policy.pick(&view, i as u64)?;
        let c = view.targets.get(pick);
        let w = self.books[r][c.worker as usize].clone();
        let guard = InflightGuard::to_target(w, c.rank, 0);
        self.out.decisions += 1;
        let unit = self.unit_for(c);
        if let Some(pd) = &mut self.pd {
            pd.reqs[i].guard = Some(guard);
        }
        Some(unit)
    }

    /// A scheduler event of `unit` at `t`, seen first by the PD fleet: `true` when it was a PD
    /// request's prefill-side event (the client hears nothing of it; the prefill's first token
    /// starts the transfer), `false` when the usual handling applies.
    pub(super) fn pd_event(&mut self, unit: usize, ev: &Event, t: f64) -> bool {
        let Some(pd) = &mut self.pd else {
            return false;
        };
        let (i, first) = match *ev {
            Event::FirstToken { id } => (id as usize, true),
            Event::Finished { id, .. } => (id as usize, false),
            Event::Token { .. } => return false,
        };
        if unit != self.reqs[i].unit {
            if !first {
                pd.reqs[i].guard = None; // the decode side answered in full
            }
            return false;
        }
        if first {
            pd.reqs[i].prefilled = Some(t);
            let p = self.layout.engine_of(unit);
            let d = self.layout.engine_of(pd.reqs[i].decode) - pd.fleet.prefill;
            let link = &mut pd.link_free[p * pd.decode_engines + d];
            let end = t.max(*link) + pd.fleet.link.transfer_s(self.arrivals[i].prompt_tokens);
            *link = end;
            self.push(end, Ev::Transferred(i));
        }
        true
    }

    /// Request `i`'s KV crossed its link at `t`: the prefill engine frees it and answers (the
    /// prefill guard ends), the decode engine admits the request at its next step.
    pub(super) fn transferred(&mut self, i: usize, t: f64) {
        let Some(pd) = &mut self.pd else {
            return;
        };
        pd.reqs[i].transferred = Some(t);
        let (decode, asked) = (pd.reqs[i].decode, pd.reqs[i].dispatched);
        let sent = t - pd.reqs[i].prefilled.unwrap_or(t);
        let (prefill, id) = (self.reqs[i].unit, i as u64);
        self.reqs[i].guard = None;
        let (_, started) = self.engines[prefill].outside(t, |s| s.finish_transfer(id, sent));
        self.advance(prefill, t, started);
        let (_, started) = self.engines[decode].outside(t, |s| s.kv_arrived(id, t - asked));
        self.advance(decode, t, started);
    }

    /// Puts every engine of a PD fleet in its mode (prefill or decode) with the link's bandwidth.
    pub(super) fn set_pd_modes(&mut self) {
        let Some(pd) = &self.pd else {
            return;
        };
        let (split, gb_s) = (self.layout.unit(pd.fleet.prefill, 0), pd.fleet.link.gb_s);
        for (u, e) in self.engines.iter_mut().enumerate() {
            let mode = if u < split {
                PdMode::Prefill
            } else {
                PdMode::Decode
            };
            e.set_disaggregation(mode, gb_s);
        }
    }

    /// The engines whose admissions the cache hit rate counts: the prefill engines of a PD fleet
    /// (a decode engine computes no prompt), every engine otherwise.
    pub(super) fn prefilling_units(&self) -> std::ops::Range<usize> {
        match &self.pd {
            Some(pd) => 0..self.layout.unit(pd.fleet.prefill, 0),
            None => 0..self.engines.len(),
        }
    }

    /// What a PD request of `prompt` tokens adds to its TTFT floor beyond its own prefill: its
    /// transfer on an idle link and the first step of an idle decode engine (0 when aggregated).
    pub(super) fn pd_floor(&self, prompt: u64) -> f64 {
        match &self.pd {
            Some(pd) => {
                let decode = self.cfg.engines[pd.fleet.prefill.min(self.cfg.engines.len() - 1)];
                pd.fleet.link.transfer_s(prompt) + first_decode_step(decode, prompt)
            }
            None => 0.0,
        }
    }

    /// The PD figures of the finished requests: their timelines and transfer waits.
    pub(super) fn pd_outcome(&self) -> Vec<PdTimeline> {
        let Some(pd) = &self.pd else {
            return Vec::new();
        };
        let req = self.reqs.iter().zip(&pd.reqs);
        req.filter_map(|(r, p)| {
            Some(PdTimeline {
                arrived: r.arrived,
                prefilled: p.prefilled?,
                transferred: p.transferred?,
                first: r.first?,
                done: r.done?,
                prefill_engine: self.layout.engine_of(r.unit),
                decode_engine: self.layout.engine_of(p.decode),
            })
        })
        .collect()
    }
}

/// Seconds from a request's KV arrival at an idle decode engine of model `m` to its first token:
/// the step that admits it (the production model's decode mode).
pub fn first_decode_step(m: ModelConfig, prompt: u64) -> f64 {
    let mut s = Scheduler::new(m);
    s.set_disaggregation(PdMode::Decode, KvLink::DEFAULT.gb_s);
    s.submit(Submit::counted(0, prompt, 2).with_disagg(Disagg::Decode));
    s.kv_arrived(0, 0.0);
    let step = s.step(0.0);
    match step.kind {
        StepKind::Idle => 0.0,
        _ => step.duration,
    }
}

#[cfg(test)]
#[path = "pd_tests.rs"]
mod tests;
