use super::*;

/// Decode step cost of the synthetic engine: α + β·b µs.
const ALPHA: f64 = 8000.0;
const BETA: f64 = 300.0;
const B: i64 = 64;

/// A synthetic rank's cumulative counters.
#[derive(Default, Clone, Copy)]
struct Counters {
    busy_us: i64,
    m: [f64; 6],
}

impl Counters {
    /// `steps` decode steps of batch `b` (one token per request per step).
    fn decode(&mut self, b: f64, steps: u32) {
        for _ in 0..steps {
            let t = ALPHA + BETA * b;
            let m = &mut self.m;
            m[0] += 1.0;
            m[1] += b;
            m[2] += t;
            m[3] += b * b;
            m[4] += b * t;
            m[5] += b;
        }
    }

    fn sample(&self, waiting: i64, backlog: i64) -> UtilSample {
        UtilSample {
            prefill_busy_us: self.busy_us,
            moments: Some(self.m),
            max_running: B,
            running: 10,
            waiting,
            backlog,
            ..Default::default()
        }
    }
}

#[test]
fn a_window_counts_prefill_time_and_not_decode_tokens() {
    let u = Utilisation::default();
    let mut c = Counters::default();
    c.decode(8.0, 10);
    u.observe(1_000, &c.sample(0, 0));
    assert_eq!(u.rho(), None, "one snapshot is no window");
    // 300 ms of prefill and 850 decode tokens in one second: a first token waits for the prefill.
    c.busy_us += 300_000;
    c.decode(17.0, 50);
    u.observe(1_500, &c.sample(0, 0));
    assert_eq!(u.rho(), None, "half a window");
    u.observe(2_000, &c.sample(0, 0));
    let rho = u.rho().unwrap();
    assert!((rho - 0.3).abs() < 1e-9, "{rho}");
    assert_eq!((u.source(), u.samples()), (UtilSource::Prefill, 1));
}

#[test]
fn windows_are_smoothed_with_the_engine_rate_window() {
    let u = Utilisation::default();
    let mut c = Counters::default();
    u.observe(1, &c.sample(0, 0));
    c.busy_us += 200_000;
    u.observe(1_001, &c.sample(0, 0)); // 0.2
    c.busy_us += 1_200_000;
    u.observe(3_001, &c.sample(0, 0)); // 0.6 over 2 s
    let w = 1.0 - (-2000.0f64 / RHO_TAU_MS as f64).exp();
    let want = 0.2 + w * (0.6 - 0.2);
    assert!((u.rho().unwrap() - want).abs() < 1e-12, "{:?}", u.rho());
    // Idle windows pull it towards 0, never below.
    for k in 0..50 {
        u.observe(4_001 + k * 1000, &c.sample(0, 0));
    }
    let rho = u.rho().unwrap();
    assert!((0.0..0.01).contains(&rho), "{rho}");
}

#[test]
fn a_queue_that_does_not_drain_is_saturation_and_rho_stays_below_one_batch() {
    let u = Utilisation::default();
    let c = Counters::default(); // no work measured at all: the bottleneck is elsewhere (KV, slots)
    u.observe(1, &c.sample(3, 5_000));
    u.observe(400, &c.sample(1, 9_000));
    u.observe(1_001, &c.sample(2, 9_000));
    let cap = B as f64 / (B as f64 + 1.0);
    assert_eq!(u.rho(), Some(cap), "saturated, capped at B/(B+1)");
    // A queue that emptied once in the window, or a backlog that shrank, is draining.
    let u = Utilisation::default();
    u.observe(1, &c.sample(3, 5_000));
    u.observe(500, &c.sample(0, 5_000));
    u.observe(1_001, &c.sample(3, 6_000));
    assert_eq!(u.rho(), Some(0.0));
    let u = Utilisation::default();
    u.observe(1, &c.sample(3, 5_000));
    u.observe(1_001, &c.sample(3, 4_000));
    assert_eq!(u.rho(), Some(0.0));
    // Measured work beyond the capacity is capped too.
    let u = Utilisation::default();
    let mut c = Counters::default();
    u.observe(1, &c.sample(0, 0));
    c.busy_us += 5_000_000;
    u.observe(1_001, &c.sample(0, 0));
    assert_eq!(u.rho(), Some(cap));
}

#[test]
fn a_restart_rebases_and_keeps_the_estimate() {
    let u = Utilisation::default();
    let mut c = Counters {
        busy_us: 50_000_000,
        ..Default::default()
    };
    c.decode(16.0, 100);
    u.observe(1, &c.sample(0, 0));
    c.busy_us += 500_000;
    u.observe(1_001, &c.sample(0, 0));
    assert!((u.rho().unwrap() - 0.5).abs() < 1e-9);
    // The engine restarted: counters from zero. No negative or huge sample, the estimate stays.
    let mut fresh = Counters::default();
    u.observe(2_001, &fresh.sample(0, 0));
    assert_eq!(
        (u.samples(), u.rho().map(|r| (r * 1e9).round())),
        (1, Some(0.5e9))
    );
    fresh.busy_us += 500_000;
    u.observe(3_001, &fresh.sample(0, 0));
    assert!((u.rho().unwrap() - 0.5).abs() < 1e-9, "{:?}", u.rho());
    assert_eq!(u.samples(), 2);
}

#[test]
fn without_counters_rho_is_the_slot_occupancy_and_without_a_bound_unknown() {
    let u = Utilisation::default();
    let s = |running| UtilSample {
        max_running: 32,
        running,
        ..Default::default()
    };
    u.observe(1, &s(8));
    u.observe(1_001, &s(8));
    assert_eq!((u.rho(), u.source()), (Some(0.25), UtilSource::Slots));
    let u = Utilisation::default();
    let none = UtilSample {
        running: 8,
        ..Default::default()
    };
    u.observe(1, &none);
    u.observe(1_001, &none);
    assert_eq!((u.rho(), u.source()), (None, UtilSource::Unknown));
}

#[test]
fn the_cap_is_the_batch_the_kv_pool_holds_when_that_is_fewer_than_the_slots() {
    let u = Utilisation::default();
    let mut c = Counters::default();
    // 10 running requests use 2,000 tokens of a 10,000-token pool: 50 of them fit, not 64.
    let at = |c: &Counters| UtilSample {
        pool_tokens: 10_000,
        used_tokens: 2_000,
        ..c.sample(0, 0)
    };
    u.observe(1, &at(&c));
    // Saturated for long: capped at B/(B+1) of that batch of 50.
    for k in 2..100 {
        c.busy_us += 2_000_000;
        u.observe(k * 1000 + 1, &at(&c));
    }
    assert_eq!(u.rho(), Some(50.0 / 51.0));
    // Without counters, occupancy is of that batch too.
    let u = Utilisation::default();
    let slots = UtilSample {
        max_running: 64,
        running: 10,
        pool_tokens: 10_000,
        used_tokens: 2_000,
        ..Default::default()
    };
    u.observe(1, &slots);
    u.observe(1_001, &slots);
    assert_eq!(
        (u.rho(), u.source()),
        (Some(10.0 / 50.0), UtilSource::Slots)
    );
}
