//! A short run of issue 19's soak (`loadlink bench soak`) as a test: the real router binary, four
//! real engines, and every kind of hostile worker. It asserts what does not depend on timing: no
//! client request fails (retries allowed), the router survives, its memory stays within idle +
//! 64 MiB, every hostile worker is registered with the reason it is not priced on engine load,
//! and refusals are counted. The executor-lateness bound is timing, so it is reported by the
//! release-build soak (`loadlink bench soak`, figures in `docs/results.md`), not asserted here.

use std::time::Duration;

#[test]
fn hostile_workers_beside_healthy_engines_cost_no_request_and_bounded_memory() {
    let s = loadlink_bench::soak::Soak {
        exe: env!("CARGO_BIN_EXE_loadlink").into(),
        duration: Duration::from_secs(15),
        engines: 4,
        rate: 10.0,
        flood_per_s: 2000,
        churn: Duration::from_secs(6),
        hostile: loadlink_bench::soak::hostile::KINDS
            .map(String::from)
            .to_vec(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(loadlink_bench::soak::run(&s)).unwrap();
    let text = r.text(&s);
    assert!(r.router_alive, "{text}");
    assert!(r.requests > 0, "{text}");
    assert_eq!(r.failed, 0, "{text}");
    assert!(
        r.max_rss_mib - r.idle_rss_mib <= loadlink_bench::soak::RSS_GROWTH_BOUND_MIB,
        "{text}"
    );
    for (kind, _, why) in &r.hostile {
        assert!(
            !why.is_empty() && why != "not registered",
            "{kind} shows why it is not priced on engine load: {text}"
        );
    }
    let refused: f64 = r.refusals.iter().map(|(_, n)| n).sum();
    assert!(refused > 0.0, "refusals are counted: {text}");
}
