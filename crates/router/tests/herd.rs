//! Field note 2, "stale load → thundering herd": between two engine snapshots, a burst must not all
//! go to the worker that looked lightest in the last one. The LoadBook adds what this router
//! dispatched since the snapshot (D), so the burst spreads. Production book and policies, no I/O.

use loadlink_router::fleet::FleetView;
use loadlink_router::{InflightGuard, LoadSignal, Policy, Worker};
use loadlink_wire::LoadSnapshot;
use std::sync::Arc;
use std::time::Instant;

/// Four workers with one fresh snapshot each; worker 0 looks a little lighter than the others.
fn fleet() -> Vec<Arc<Worker>> {
    let epoch = Instant::now();
    (0..4)
        .map(|i| {
            let w = Arc::new(Worker::new(format!("http://w{i}"), 1, None, epoch));
            let waiting = i64::from(i != 0);
            let snap = LoadSnapshot {
                num_running_reqs: 8,
                num_waiting_reqs: waiting,
                num_waiting_uncached_tokens: 512 * waiting,
                ..Default::default()
            };
            w.record_at(0, 0, &snap, 1_000);
            w
        })
        .collect()
}

#[test]
fn a_burst_between_two_snapshots_spreads_over_the_fleet() {
    for signal in [LoadSignal::Engine, LoadSignal::Backlog] {
        for policy in [Policy::LeastLoad, Policy::PowerOfTwo] {
            let workers = fleet();
            let mut view = FleetView::new(&workers, signal, 3_000);
            view.now_ms = 1_001; // the snapshots are 1 ms old: fresh, and no newer one arrives
            let mut hits = [0usize; 4];
            for seq in 0..40 {
                let i = policy.pick(&view, seq).expect("a worker is available");
                hits[i] += 1;
                // Short requests: each finishes before the next pick, so the in-flight count (F)
                // stays 0 and only the dispatch correction (D) can spread the burst.
                drop(InflightGuard::new(workers[i].clone()));
            }
            let label = format!("{policy:?} / {}", signal.as_str());
            assert!(
                hits.iter().all(|&h| h >= 4),
                "{label}: every worker gets part of the burst: {hits:?}"
            );
            assert!(
                hits[0] <= 16,
                "{label}: the lightest-looking worker gets at most 40% of the burst: {hits:?}"
            );
        }
    }
}
