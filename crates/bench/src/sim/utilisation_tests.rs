//! The router book's utilisation ρ against the offered load: a cache-blind fleet at load L (of
//! `scenario::engine_capacity`, the full-batch capacity) must read ρ ≈ L, or a price built on ρ
//! would mean something else than the load the benchmarks are calibrated on.

use crate::scenario::{CACHE_VARIANTS, Scenario, arrivals, by_name, run_arrivals};
use crate::workload::Arrival;

/// Mean ρ the first router measured over the arrivals, cache-blind routing.
fn measured_rho(s: &Scenario, a: &[Arrival]) -> f64 {
    let blind = CACHE_VARIANTS
        .iter()
        .find(|v| v.label == "power_of_two / backlog")
        .expect("the cache-blind baseline");
    let (_, queues) = run_arrivals(s, a, blind);
    queues.mean_utilisation.expect("ρ measured")
}

/// The work these very arrivals bring per engine-second, at full-batch cost (the calibration's
/// formula on their realised means): what ρ should read, sampling noise of the seed included.
fn realised_load(s: &Scenario, a: &[Arrival]) -> f64 {
    let (t, b) = (s.model.timing, s.model.max_running_requests as f64);
    let n = a.len() as f64;
    let prompt = a.iter().map(|x| x.prompt_tokens as f64).sum::<f64>() / n;
    let output = a.iter().map(|x| x.output_tokens as f64).sum::<f64>() / n;
    let step_us =
        t.base_us + t.per_batch_req_us * b + t.per_kv_token_us * b * (prompt + output / 2.0);
    let per_request_us =
        prompt * (t.per_prefill_token_us + t.per_kv_token_us) + output * step_us / b;
    let span = a.last().map_or(1.0, |x| x.t);
    n * per_request_us / 1e6 / span / s.schedulers() as f64
}

#[test]
fn a_cache_blind_fleet_reads_its_offered_load() {
    let mut s = by_name("s1").expect("s1");
    s.duration_s = 60.0;
    for load in [0.5, 0.8] {
        let a = arrivals(&s, 1, load);
        let (rho, realised) = (measured_rho(&s, &a), realised_load(&s, &a));
        eprintln!("s1 seed 1, 60 s, load {load}: realised {realised:.3}, mean ρ {rho:.3}");
        assert!((rho - load).abs() <= 0.1, "load {load}: ρ {rho}");
        assert!(
            (rho - realised).abs() <= 0.05,
            "realised {realised}: ρ {rho}"
        );
    }
}
