use crate::scenario::*;
use crate::sim::{CacheView, SimRouter};
use loadlink_router::policy::{FleetPricing, MinTtft};
use loadlink_router::{LoadSignal, Policy};

#[test]
#[ignore]
fn scratch() {
    let name = std::env::var("W").unwrap_or("agentic".into());
    let load: f64 = std::env::var("L")
        .map(|x| x.parse().unwrap())
        .unwrap_or(0.85);
    let dur: f64 = std::env::var("D")
        .map(|x| x.parse().unwrap())
        .unwrap_or(300.0);
    let mut s = by_name(&name).unwrap();
    s.duration_s = dur;
    let a = arrivals(&s, 1, load);
    let base = match MIN_TTFT {
        Policy::MinTtft(p) => p,
        _ => unreachable!(),
    };
    let vs: Vec<(&str, MinTtft)> = vec![
        ("default", base),
        (
            "no kv penalty",
            MinTtft {
                kv_pressure_s: 0.0,
                ..base
            },
        ),
        (
            "blind",
            MinTtft {
                fleet_pricing: FleetPricing::Blind,
                ..base
            },
        ),
        (
            "blind no kv",
            MinTtft {
                fleet_pricing: FleetPricing::Blind,
                kv_pressure_s: 0.0,
                ..base
            },
        ),
    ];
    let only = std::env::var("V").ok();
    std::thread::scope(|sc| {
        for (label, p) in vs {
            if only.as_deref().is_some_and(|o| !label.contains(o)) {
                continue;
            }
            let (s, a) = (&s, &a);
            sc.spawn(move || {
                let v = Variant {
                    label,
                    router: SimRouter::Policy(Policy::MinTtft(p)),
                    signal: LoadSignal::Backlog,
                    cache: CacheView::Index,
                };
                let (o, q) = run_arrivals(s, a, &v);
                let r = crate::sweep::row(load, &v, &o, &q);
                let w = crate::sweep::recovery::windowed_p50(&o, 20.0);
                eprintln!(
                    "{label:<16} hit {:.1}% p50 {:.3} p99 {:.3} rho {:?} windows {:?}",
                    r.hit * 100.0,
                    r.p50,
                    r.p99,
                    r.rho,
                    w.iter()
                        .map(|x| (x * 100.0).round() / 100.0)
                        .collect::<Vec<_>>()
                );
            });
        }
    });
}
