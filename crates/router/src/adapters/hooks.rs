//! Where the rest of the router feeds the adapter book and reads it: a worker's discovered models
//! ([`AdapterBook::apply_served`], at each model refresh) and the `/metrics` families
//! ([`AdapterBook::write_metrics`]). Kept apart from the book's own logic so the wiring reads in
//! one place.

use super::AdapterBook;
use crate::models::served::ServedModels;
use loadlink_wire::prom::{Exposition, MetricType};
use std::sync::atomic::Ordering::Relaxed;

impl AdapterBook {
    /// What a worker's model discovery found (`/server_info`'s `max_loaded_loras`,
    /// `lora_load_time_s` and, from `loadlink engine`, `loaded_loras`): its pool size and load time
    /// replace the book's defaults, and its report of loaded adapters replaces the dispatch
    /// history. A worker that reports no `loaded_loras` keeps the history.
    pub fn apply_served(&self, worker: &str, served: &ServedModels, now_ms: u64) {
        let capacity = served.max_loaded_loras.map(|n| n as usize);
        self.configure(worker, capacity, served.lora_load_time_s);
        if let Some(loaded) = &served.loaded {
            self.report(worker, loaded, now_ms);
        }
    }

    /// The book's counters as `/metrics` families.
    pub fn write_metrics(&self, e: &mut Exposition) {
        let c = &self.counters;
        for (name, help, value) in [
            (
                "loadlink_adapter_dispatches_total",
                "Requests for a LoRA adapter recorded in the adapter book",
                &c.dispatches,
            ),
            (
                "loadlink_adapter_predicted_loads_total",
                "Of them, sent where the adapter was not believed loaded (a load predicted)",
                &c.predicted_loads,
            ),
            (
                "loadlink_adapter_predicted_evictions_total",
                "Of those, loads predicted to evict a loaded adapter",
                &c.predicted_evictions,
            ),
            (
                "loadlink_adapter_reports_total",
                "Engine reports of loaded adapters applied (loaded_loras)",
                &c.reports,
            ),
        ] {
            e.single(name, MetricType::Counter, help, value.load(Relaxed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_configures_and_reports_and_the_counters_are_written() {
        let b = AdapterBook::default();
        let served = ServedModels {
            max_loaded_loras: Some(1),
            lora_load_time_s: Some(0.3),
            loaded: Some(vec![vec!["a".into()]]),
            ..ServedModels::default()
        };
        b.apply_served("http://w", &served, 0);
        let (a, x) = (b.id("a").unwrap(), b.intern("x").unwrap());
        assert!(b.price("http://w", Some(0), a, 0).resident);
        // One slot, held by `a` (idle): `x` evicts it, at the advertised load time.
        let c = b.price("http://w", Some(0), x, 0);
        assert!(c.evicts && (c.load_s - 0.3).abs() < 1e-12, "{c:?}");
        // No `loaded_loras` this time: the history stays.
        b.record_dispatch("http://w", Some(0), x, 10);
        let quiet = ServedModels {
            loaded: None,
            ..served
        };
        b.apply_served("http://w", &quiet, 20);
        assert_eq!(b.resident("http://w", 0, 20), ["x"]);
        let mut e = Exposition::default();
        b.write_metrics(&mut e);
        let text = e.finish();
        assert!(text.contains("loadlink_adapter_reports_total 1"), "{text}");
        assert!(
            text.contains("loadlink_adapter_predicted_loads_total 1"),
            "{text}"
        );
    }
}
