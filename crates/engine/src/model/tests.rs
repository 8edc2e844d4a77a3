//! The scheduler model on a virtual clock.

use super::*;
use std::collections::HashMap;

/// Runs the scheduler in virtual time, submitting `arrivals` (time, request) as they come;
/// returns (TTFT per id, finish time per id, max waiting seen, retractions).
fn simulate(
    cfg: ModelConfig,
    arrivals: &[(f64, Submit)],
    horizon: f64,
) -> (HashMap<u64, f64>, HashMap<u64, f64>, usize, Scheduler) {
    let mut s = Scheduler::new(cfg);
    let (mut now, mut next) = (0.0, 0);
    let (mut ttft, mut done) = (HashMap::new(), HashMap::new());
    let mut max_waiting = 0;
    let arrived_at: HashMap<u64, f64> = arrivals.iter().map(|(t, r)| (r.id, *t)).collect();
    while now < horizon {
        while next < arrivals.len() && arrivals[next].0 <= now {
            s.submit(arrivals[next].1.clone());
            next += 1;
        }
        max_waiting = max_waiting.max(s.num_waiting());
        let step = s.step(now);
        if step.kind == StepKind::Idle {
            if next >= arrivals.len() {
                break;
            }
            now = arrivals[next].0;
            continue;
        }
        now += step.duration;
        for e in step.events {
            match e {
                Event::FirstToken { id } => {
                    ttft.insert(id, now - arrived_at[&id]);
                }
                Event::Finished { id, .. } => {
                    done.insert(id, now);
                }
                Event::Token { .. } => {}
            }
        }
    }
    (ttft, done, max_waiting, s)
}

fn req(id: u64, prompt: u64, out: u64) -> Submit {
    Submit::counted(id, prompt, out)
}

#[test]
fn overload_grows_the_queue_and_ttft() {
    let cfg = ModelConfig {
        max_running_requests: 8,
        ..Default::default()
    };
    // 10 requests/s of 200-token outputs: far above what 8 slots at ~10 ms/step can serve.
    let arrivals: Vec<_> = (0..200)
        .map(|i| (i as f64 * 0.1, req(i, 500, 200)))
        .collect();
    let (ttft, done, max_waiting, _) = simulate(cfg, &arrivals, 10_000.0);
    assert_eq!(done.len(), 200, "every request finishes");
    assert!(
        max_waiting > 50,
        "the queue grows under overload: {max_waiting}"
    );
    let early: f64 = (0..10).map(|i| ttft[&i]).sum::<f64>() / 10.0;
    let late: f64 = (190..200).map(|i| ttft[&i]).sum::<f64>() / 10.0;
    assert!(
        late > 10.0 * early,
        "TTFT grows with the queue: early {early:.3}s, late {late:.3}s"
    );
}

#[test]
fn light_load_has_no_queue() {
    let arrivals: Vec<_> = (0..50).map(|i| (i as f64 * 1.0, req(i, 200, 20))).collect();
    let (ttft, done, max_waiting, _) = simulate(ModelConfig::default(), &arrivals, 1_000.0);
    assert_eq!(done.len(), 50);
    assert!(max_waiting <= 1);
    assert!(
        ttft.values().all(|&t| t < 0.1),
        "prefill of 200 tokens ≈ 30 ms"
    );
}

#[test]
fn kv_exhaustion_stops_admission_retracts_and_loses_nothing() {
    let cfg = ModelConfig {
        max_total_tokens: 4_000,
        new_token_ratio: 0.1,
        max_running_requests: 64,
        ..Default::default()
    };
    let arrivals: Vec<_> = (0..40).map(|i| (0.0, req(i, 300, 400))).collect();
    let mut s = Scheduler::new(cfg);
    for (_, r) in &arrivals {
        s.submit(r.clone());
    }
    let first = s.step(0.0);
    assert_eq!(first.kind, StepKind::Prefill);
    assert!(
        s.num_running() < 40 && s.num_waiting() > 0,
        "admission stops when the pool is reserved"
    );
    assert!(s.used_tokens() <= 4_000);
    let (_, done, _, s) = simulate(cfg, &arrivals, 100_000.0);
    assert_eq!(done.len(), 40, "nothing lost");
    assert!(
        s.retractions() > 0,
        "optimistic reservation leads to retraction"
    );
    assert_eq!(s.used_tokens(), 0);
}

#[test]
fn chunked_prefill_spreads_a_long_prompt_over_steps() {
    let cfg = ModelConfig {
        chunked_prefill_size: 1_000,
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg);
    s.submit(req(1, 3_500, 5));
    let mut prefill_steps = 0;
    let mut now = 0.0;
    loop {
        let st = s.step(now);
        now += st.duration;
        if st.kind != StepKind::Prefill {
            break;
        }
        prefill_steps += 1;
        if prefill_steps < 4 {
            assert!(st.events.is_empty(), "no first token before the last chunk");
            assert_eq!(s.num_waiting(), 1);
            assert_eq!(s.used_tokens(), 1_000 * prefill_steps);
        } else {
            assert_eq!(st.events, vec![Event::FirstToken { id: 1 }]);
        }
    }
    assert_eq!(prefill_steps, 4);
}

#[test]
fn abort_frees_kv_everywhere() {
    let mut s = Scheduler::new(ModelConfig {
        chunked_prefill_size: 100,
        max_running_requests: 2,
        ..Default::default()
    });
    s.submit(req(1, 50, 100));
    s.submit(req(2, 50, 100));
    s.submit(req(3, 500, 100));
    s.step(0.0); // 1 and 2 run
    s.step(0.1); // decode
    assert!(s.used_tokens() > 100);
    assert!(s.abort(1) && s.abort(2));
    assert_eq!(s.used_tokens(), 0);
    s.step(0.2); // 3 starts chunked prefill
    assert_eq!(s.used_tokens(), 100);
    assert!(s.abort(3));
    assert_eq!(s.used_tokens(), 0);
    assert!(!s.abort(3));
    assert!(s.is_idle());
}

#[test]
fn snapshot_reports_the_state() {
    let mut s = Scheduler::new(ModelConfig {
        max_running_requests: 1,
        ..Default::default()
    });
    s.submit(req(1, 100, 10));
    s.submit(req(2, 300, 10));
    s.step(0.0);
    let snap = s.snapshot(3, 123.0);
    assert_eq!(
        (snap.dp_rank, snap.num_running_reqs, snap.num_waiting_reqs),
        (3, 1, 1)
    );
    assert_eq!(snap.num_waiting_uncached_tokens, 300);
    assert_eq!(snap.num_used_tokens, 100);
    assert_eq!(snap.num_total_tokens, 400);
    assert_eq!(snap.timestamp, Some(123.0));
    assert_eq!(snap.total_prefill_uncached_tokens, 100);
}

#[test]
fn decode_step_time_matches_the_calibration() {
    let mut s = Scheduler::new(ModelConfig::default());
    for i in 0..64 {
        s.submit(req(i, 1_000, 100));
    }
    let mut now = 0.0;
    let st = loop {
        let st = s.step(now);
        now += st.duration;
        if st.kind == StepKind::Decode {
            break st;
        }
    };
    assert!(
        (st.duration - 0.030).abs() < 0.004,
        "decode at batch 64 ≈ 30 ms, got {:.4}",
        st.duration
    );
}
