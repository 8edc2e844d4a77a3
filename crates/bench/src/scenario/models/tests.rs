//! The models scenario: each request reaches only engines serving its model, and adapter-aware
//! `min_ttft` loads adapters less often than adapter-blind on the same arrivals.

use super::*;
use crate::sim::{isolated_ttft, simulate};
use crate::workload::ModelRef;

fn short() -> Scenario {
    Scenario {
        duration_s: 60.0,
        ..scenario()
    }
}

#[test]
fn requests_go_only_to_engines_serving_their_model() {
    let s = short();
    let mut a = arrivals(&s, 1, 0.5);
    let small = fleet()[3].1;
    // Everything names `small`: its one engine takes it all, at its own prefill speed (each
    // request's floor is the isolated TTFT on the engine that served it).
    for x in &mut a {
        x.model = Some(ModelRef {
            model: SMALL.into(),
            adapter: None,
        });
    }
    a.truncate(40);
    let cfg = super::super::sim_config(&s, &MODEL_VARIANTS[0].router, None);
    let o = simulate(&cfg, &a, 600.0);
    assert_eq!(o.completed, a.len());
    let expected: Vec<f64> = a
        .iter()
        .map(|x| isolated_ttft(small, x.prompt_tokens))
        .collect();
    let mut floors = o.ttft_floor.clone();
    let mut want = expected.clone();
    floors.sort_by(f64::total_cmp);
    want.sort_by(f64::total_cmp);
    assert_eq!(
        floors, want,
        "every request served by the small model's engine"
    );
    assert_eq!(o.adapter_loads, 0);
    // A model no engine serves is refused, not sent anywhere.
    a[0].model = Some(ModelRef {
        model: "nobody-serves-this".into(),
        adapter: None,
    });
    let o = simulate(&cfg, &a, 600.0);
    assert_eq!((o.rejected, o.completed), (1, a.len() - 1));
}

#[test]
fn adapter_aware_min_ttft_loads_adapters_less_often_than_blind() {
    let s = short();
    // The reports row reads the engines every second: at the default 30 s, a 60 s run's two
    // reports can match the dispatch history exactly and change nothing.
    let often = ModelVariant {
        reports_s: Some(1.0),
        ..MODEL_VARIANTS[4]
    };
    let variants = [MODEL_VARIANTS[2], MODEL_VARIANTS[3], often];
    let rows = comparison(&s, 1, s.load, &variants, |_| {});
    let reported = &rows[2].outcome;
    let p99 = |o: &Outcome| quantile(&o.ttft, 0.99);
    let (blind, aware) = (&rows[0].outcome, &rows[1].outcome);
    assert!(blind.adapter_requests > 200, "{}", blind.adapter_requests);
    assert_eq!(blind.completed, aware.completed);
    eprintln!("{}{}", table(&rows), acceptance(&rows));
    assert!(
        aware.adapter_loads * 10 <= blind.adapter_loads * 7,
        "aware {} vs blind {} loads",
        aware.adapter_loads,
        blind.adapter_loads
    );
    assert!(p99(aware) < p99(blind), "{} vs {}", p99(aware), p99(blind));
    assert!(acceptance(&rows).contains("the adapter loads"));
    // Reading the engines' reports changes what the router believes, so where it routes.
    assert_eq!(reported.completed, aware.completed);
    assert_ne!(reported.ttft, aware.ttft, "the reports were read");
}
