//! What a finished run measured: per request its TTFT, E2E and TTFT floor, and the fleet's cache
//! and adapter totals (kept apart from the event loop in [`super`]).

use super::engine::SimEngine;
use super::{Outcome, QueueStats, Sim, isolated_ttft};
use loadlink_engine::model::Event;

impl Sim<'_> {
    /// At a request's first token on the engine that prefilled it: the cached prefix it was
    /// admitted with there, which its own prefill (the floor below) leaves out.
    pub(super) fn note_hit(&mut self, e: usize, ev: &Event) {
        if let Event::FirstToken { id } = *ev {
            let r = &mut self.reqs[id as usize];
            if r.unit == e {
                r.hit = self.engines[e].admitted_hit(id).unwrap_or(0);
            }
        }
    }

    /// The run's outcome and queue figures.
    pub(super) fn finish(mut self) -> (Outcome, QueueStats) {
        let (cfg, arrivals, layout) = (self.cfg, self.arrivals, self.layout);
        let sim = &mut self;
        let mut out = std::mem::take(&mut sim.out);
        let mut floors = std::collections::HashMap::new();
        for (i, r) in sim.reqs.iter().enumerate() {
            if let (Some(f), Some(d)) = (r.first, r.done) {
                out.ttft.push(f - r.arrived);
                out.arrived.push(r.arrived);
                out.e2e.push(d - r.arrived);
                let e = layout.engine_of(r.unit);
                let prompt = arrivals[i].prompt_tokens;
                // Its own prefill: the tokens it did not find cached (at least one is computed).
                let own = prompt.saturating_sub(r.hit).max(1);
                let floor = *floors
                    .entry((e, prompt, own))
                    .or_insert_with(|| isolated_ttft(cfg.engines[e], own) + sim.pd_floor(prompt));
                out.ttft_floor.push(floor);
                let output = arrivals[i].output_tokens;
                if output >= 2 {
                    out.tpot.push((d - f) / (output - 1) as f64);
                }
            }
        }
        out.completed = out.e2e.len();
        out.pd = sim.pd_outcome();
        let prefilling = &sim.engines[sim.prefilling_units()];
        let totals = prefilling.iter().map(SimEngine::cache_totals);
        out.cache_tokens = Some(totals.fold((0, 0), |(c, p), (ec, ep)| (c + ec, p + ep)));
        out.loaded_back_tokens = prefilling.iter().map(SimEngine::loaded_back_tokens).sum();
        out.adapter_loads = sim.engines.iter().map(SimEngine::adapter_loads).sum();
        out.adapter_requests = (0..arrivals.len())
            .filter(|&i| sim.models.adapter(i).is_some() && sim.reqs[i].done.is_some())
            .count() as u64;
        let queues = sim.queues.finish(&mut out);
        (out, queues)
    }
}
