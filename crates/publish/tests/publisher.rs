//! `Publisher` semantics: one collection per cycle, per-sink cadence, force, isolation, throttle.

use loadlink_publish::{
    Encoded, FailureReport, LoadSource, Publisher, Sink, SinkError, WriteOutcome,
};
use loadlink_wire::LoadSnapshot;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    Fail,
    Panic,
}

/// A sink that records the bytes it was handed.
struct Recorder {
    interval: u32,
    behaviour: Behaviour,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Sink for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn interval(&self) -> u32 {
        self.interval
    }
    fn internal(&self) -> bool {
        false
    }
    fn write(&mut self, snap: Encoded<'_>) -> Result<WriteOutcome, SinkError> {
        match self.behaviour {
            Behaviour::Ok => {
                self.got.lock().unwrap().push(snap.bytes.to_vec());
                Ok(WriteOutcome::Sent)
            }
            Behaviour::Fail => Err(SinkError::Config("boom".into())),
            Behaviour::Panic => panic!("sink exploded"),
        }
    }
    fn close(&mut self) {}
}

type Log = Arc<Mutex<Vec<Vec<u8>>>>;

fn recorder(interval: u32, behaviour: Behaviour) -> (Box<dyn Sink>, Log) {
    let got: Log = Arc::default();
    (
        Box::new(Recorder {
            interval,
            behaviour,
            got: got.clone(),
        }),
        got,
    )
}

fn counting_source(calls: Arc<AtomicUsize>) -> impl FnMut() -> Result<LoadSnapshot, String> {
    move || {
        let n = calls.fetch_add(1, Ordering::SeqCst) as i64;
        Ok(LoadSnapshot {
            num_waiting_reqs: n + 1,
            ..Default::default()
        })
    }
}

/// A publisher over well-behaved recorders, with its collection count and each recorder's log.
struct Recording<S: LoadSource> {
    /// The publisher under test.
    p: Publisher<S>,
    calls: Arc<AtomicUsize>,
    logs: Vec<Log>,
}

/// A [`Recording`] with one recorder per interval, counting its collections.
fn recording(intervals: &[u32]) -> Recording<impl LoadSource> {
    let calls = Arc::new(AtomicUsize::new(0));
    let (sinks, logs) = intervals
        .iter()
        .map(|&i| recorder(i, Behaviour::Ok))
        .unzip();
    Recording {
        p: Publisher::new(counting_source(calls.clone()), sinks),
        calls,
        logs,
    }
}

#[test]
fn one_collection_per_cycle_and_every_due_sink_gets_the_same_bytes() {
    let Recording { mut p, calls, logs } = recording(&[1, 1, 1]);
    for _ in 0..5 {
        let r = p.publish(false);
        assert_eq!((r.collected, r.due, r.sent), (true, 3, 3));
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "exactly one collection per cycle"
    );
    let (la, lb, lc) = (
        logs[0].lock().unwrap(),
        logs[1].lock().unwrap(),
        logs[2].lock().unwrap(),
    );
    assert_eq!(*la, *lb);
    assert_eq!(*lb, *lc);
    assert_eq!(la.len(), 5);
    assert_ne!(la[0], la[1], "each cycle carries a fresh snapshot");
}

#[test]
fn intervals_are_independent_force_overrides_and_idle_cycles_skip_collection() {
    let Recording { mut p, calls, logs } = recording(&[1, 2, 3]);
    let [la, lb, lc] = &logs[..] else {
        unreachable!("three recorders")
    };
    for _ in 0..6 {
        p.publish(false);
    }
    assert_eq!(
        (
            la.lock().unwrap().len(),
            lb.lock().unwrap().len(),
            lc.lock().unwrap().len()
        ),
        (6, 3, 2)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 6);

    let r = p.publish(true);
    assert_eq!(r.due, 3, "force makes every sink due");
    assert_eq!((lb.lock().unwrap().len(), lc.lock().unwrap().len()), (4, 3));

    // With only slow sinks, the calls in between collect nothing.
    let Recording { mut p, calls, .. } = recording(&[4]);
    let collected: Vec<bool> = (0..8).map(|_| p.publish(false).collected).collect();
    assert_eq!(
        collected,
        [false, false, false, true, false, false, false, true]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn failing_and_panicking_sinks_do_not_stop_the_others() {
    let (bad, _) = recorder(1, Behaviour::Fail);
    let (boom, _) = recorder(1, Behaviour::Panic);
    let (good, lg) = recorder(1, Behaviour::Ok);
    let reports: Arc<Mutex<Vec<FailureReport>>> = Arc::default();
    let r2 = reports.clone();
    let mut p = Publisher::new(counting_source(Arc::default()), vec![bad, boom, good])
        .with_reporter(move |r| r2.lock().unwrap().push(r.clone()));
    for _ in 0..3 {
        let r = p.publish(false);
        assert_eq!((r.sent, r.failed), (1, 2));
    }
    assert_eq!(lg.lock().unwrap().len(), 3);
    let stats = p.stats();
    assert_eq!(stats[0].1.failed.load(Ordering::Relaxed), 3);
    assert_eq!(stats[1].1.failed.load(Ordering::Relaxed), 3);
    assert_eq!(stats[2].1.published.load(Ordering::Relaxed), 3);
    let reports = reports.lock().unwrap();
    assert!(
        reports
            .iter()
            .any(|r| r.message.contains("panicked: sink exploded"))
    );
}

#[test]
fn failures_are_reported_first_then_every_nth_with_the_count() {
    let (bad, _) = recorder(1, Behaviour::Fail);
    let reports: Arc<Mutex<Vec<u64>>> = Arc::default();
    let r2 = reports.clone();
    let mut p = Publisher::with_report_every(counting_source(Arc::default()), vec![bad], 4)
        .with_reporter(move |r| r2.lock().unwrap().push(r.count));
    for _ in 0..9 {
        p.publish(false);
    }
    assert_eq!(*reports.lock().unwrap(), [1, 4, 8]);
}

#[test]
fn a_failed_collection_publishes_nothing_and_is_throttled() {
    let (a, la) = recorder(1, Behaviour::Ok);
    let reports: Arc<Mutex<Vec<FailureReport>>> = Arc::default();
    let r2 = reports.clone();
    let mut fail = true;
    let source = move || {
        if fail {
            fail = false;
            Err("scheduler busy".to_string())
        } else {
            Ok(LoadSnapshot::default())
        }
    };
    let mut p =
        Publisher::new(source, vec![a]).with_reporter(move |r| r2.lock().unwrap().push(r.clone()));
    let r = p.publish(false);
    assert_eq!((r.collected, r.sent), (false, 0));
    assert!(la.lock().unwrap().is_empty());
    assert_eq!(p.publish(false).sent, 1);
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        (
            reports[0].origin,
            reports[0].count,
            reports[0].message.as_str()
        ),
        ("collect", 1, "scheduler busy")
    );
}
