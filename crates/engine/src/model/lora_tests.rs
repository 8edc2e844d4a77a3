//! LoRA residency in the scheduler model, on a virtual clock.

use super::*;
use std::collections::HashMap;

const LOAD_S: f64 = 0.25;

fn cfg(max_loaded: usize) -> ModelConfig {
    ModelConfig {
        lora: LoraConfig {
            max_loaded,
            load_time_s: LOAD_S,
        },
        ..Default::default()
    }
}

/// Steps until idle; returns each request's (first-token time, finish time).
fn run(s: &mut Scheduler, now: &mut f64) -> HashMap<u64, (f64, f64)> {
    let mut seen: HashMap<u64, (f64, f64)> = HashMap::new();
    while !s.is_idle() {
        let step = s.step(*now);
        *now += step.duration;
        for e in step.events {
            match e {
                Event::FirstToken { id } => {
                    seen.entry(id).or_default().0 = *now;
                }
                Event::Finished { id, .. } => {
                    seen.entry(id).or_default().1 = *now;
                }
                Event::Token { .. } => {}
            }
        }
    }
    seen
}

fn with(id: u64, adapter: u32, out: u64) -> Submit {
    Submit::counted(id, 100, out).with_adapter(adapter)
}

#[test]
fn a_load_beyond_the_slots_evicts_the_least_recently_used_idle_adapter() {
    let mut s = Scheduler::new(cfg(2));
    let mut now = 0.0;
    for (id, adapter) in [(1, 0), (2, 1), (3, 0)] {
        s.submit(with(id, adapter, 3));
        run(&mut s, &mut now);
    }
    // 0 was used after 1: 1 is the least recently used.
    assert_eq!(s.resident_adapters(), vec![1, 0]);
    assert_eq!(
        s.adapter_loads(),
        2,
        "the second use of adapter 0 loads nothing"
    );
    s.submit(with(4, 2, 3));
    run(&mut s, &mut now);
    assert_eq!(s.resident_adapters(), vec![0, 2], "adapter 1 evicted");
    assert_eq!(s.adapter_loads(), 3);
    // Adapter 1 again: loaded again, in place of 0 (now the least recently used).
    s.submit(with(5, 1, 3));
    run(&mut s, &mut now);
    assert_eq!(s.resident_adapters(), vec![2, 1]);
    assert_eq!(s.adapter_loads(), 4);
}

#[test]
fn an_adapter_in_use_is_never_evicted_and_the_request_waits() {
    let mut s = Scheduler::new(cfg(1));
    let mut now = 0.0;
    s.submit(with(1, 0, 40));
    let first = s.step(now);
    now += first.duration;
    assert_eq!(s.num_running(), 1);
    // Adapter 1 cannot be loaded while request 1 uses adapter 0; a base-model request behind it
    // is not held up.
    s.submit(with(2, 1, 2));
    s.submit(Submit::counted(3, 100, 2));
    let mut first_done = false;
    while !first_done {
        assert_eq!(
            s.resident_adapters(),
            vec![0],
            "adapter 0 evicted while in use"
        );
        assert_eq!(s.adapter_loads(), 1);
        let step = s.step(now);
        now += step.duration;
        for e in step.events {
            assert_ne!(
                e,
                Event::FirstToken { id: 2 },
                "request 2 ran beside adapter 0"
            );
            first_done |= matches!(e, Event::Finished { id: 1, .. });
        }
    }
    let rest = run(&mut s, &mut now);
    assert!(
        rest.contains_key(&2),
        "request 2 ran once adapter 0 was idle"
    );
    assert_eq!(s.resident_adapters(), vec![1]);
    assert_eq!(s.adapter_loads(), 2);
}

#[test]
fn the_base_model_request_runs_past_a_waiting_adapter_request() {
    let mut s = Scheduler::new(cfg(1));
    let mut now = 0.0;
    s.submit(with(1, 0, 40));
    now += s.step(now).duration;
    s.submit(with(2, 1, 2));
    s.submit(Submit::counted(3, 100, 2));
    let seen = run(&mut s, &mut now);
    let (first_of_3, first_of_2) = (seen[&3].0, seen[&2].0);
    assert!(
        first_of_3 < seen[&1].1 && seen[&1].1 <= first_of_2,
        "3 runs beside 1, 2 only after 1: {seen:?}"
    );
}

#[test]
fn the_load_time_shows_in_the_first_token() {
    let first_token = |adapter: Option<u32>, lora: usize| {
        let mut s = Scheduler::new(cfg(lora));
        let mut req = Submit::counted(1, 100, 1);
        req.adapter = adapter;
        s.submit(req);
        let mut now = 0.0;
        run(&mut s, &mut now)[&1].0
    };
    let base = first_token(None, 2);
    let adapted = first_token(Some(0), 2);
    assert!(
        (adapted - base - LOAD_S).abs() < 1e-9,
        "a load adds {LOAD_S} s: {base} vs {adapted}"
    );
    // LoRA off: the adapter is ignored, nothing loads.
    assert_eq!(first_token(Some(0), 0), base);

    // A second request of a resident adapter pays nothing.
    let mut s = Scheduler::new(cfg(2));
    let mut now = 0.0;
    s.submit(with(1, 0, 1));
    run(&mut s, &mut now);
    let start = now;
    s.submit(with(2, 0, 1));
    let again = run(&mut s, &mut now)[&2].0 - start;
    assert!((again - base).abs() < 1e-9, "{again} vs {base}");
    assert_eq!(s.adapter_loads(), 1);
}

#[test]
fn loads_in_one_step_add_up_and_are_counted() {
    let mut s = Scheduler::new(cfg(3));
    for (id, adapter) in [(1, 0), (2, 1), (3, 2)] {
        s.submit(with(id, adapter, 1));
    }
    let step = s.step(0.0);
    assert_eq!(step.kind, StepKind::Prefill);
    assert_eq!(s.adapter_loads(), 3);
    let mut solo = Scheduler::new(cfg(0));
    for id in 1..=3 {
        solo.submit(Submit::counted(id, 100, 1));
    }
    let plain = solo.step(0.0);
    assert!((step.duration - plain.duration - 3.0 * LOAD_S).abs() < 1e-9);
    // A fourth adapter while the three are idle again: one eviction, one more load.
    s.submit(with(4, 3, 1));
    let mut now = step.duration;
    run(&mut s, &mut now);
    assert_eq!(s.adapter_loads(), 4);
    assert_eq!(s.resident_adapters().len(), 3);
    assert!(
        !s.resident_adapters().contains(&0),
        "adapter 0 was the least recently used"
    );
}
