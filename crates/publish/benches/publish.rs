//! Cost of one publish cycle with the SHM and PUB (generation A) sinks for a realistic snapshot
//! (collection excluded: the source returns a prepared snapshot clone).

use criterion::{Criterion, criterion_group, criterion_main};
use loadlink_publish::{PubSink, Publisher, ShmSink, Sink, free_port_block};
use loadlink_wire::snapshot::*;
use loadlink_wire::{Generation, LoadSnapshot};

#[path = "../../wire/benches/codec.rs"]
#[allow(dead_code)]
mod wire_codec;

fn wildcard_free() -> String {
    format!("tcp://*:{}", free_port_block(1).unwrap())
}

fn cycle(c: &mut Criterion) {
    let snap: LoadSnapshot = wire_codec::realistic();
    let _ = QueueMetrics::default();
    let dir = std::env::temp_dir().join(format!("loadlink-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ctx = zmq::Context::new();

    let shm = ShmSink::open(&dir.join("a.shm"), 4, 3, 1).unwrap();
    let pubs = PubSink::bind(&ctx, &wildcard_free(), Generation::Snapshot, 3, 1).unwrap();
    let s1 = snap.clone();
    let mut p = Publisher::new(
        move || Ok(s1.clone()),
        vec![Box::new(shm) as Box<dyn Sink>, Box::new(pubs)],
    );
    c.bench_function("publish_cycle_shm_pub_a", |b| b.iter(|| p.publish(false)));

    let shm = ShmSink::open(&dir.join("b.shm"), 4, 3, 1).unwrap();
    let s2 = snap.clone();
    let mut p = Publisher::new(move || Ok(s2.clone()), vec![Box::new(shm) as Box<dyn Sink>]);
    c.bench_function("publish_cycle_shm_only", |b| b.iter(|| p.publish(false)));

    let pubs = PubSink::bind(&ctx, &wildcard_free(), Generation::Snapshot, 3, 1).unwrap();
    let s3 = snap.clone();
    let mut p = Publisher::new(
        move || Ok(s3.clone()),
        vec![Box::new(pubs) as Box<dyn Sink>],
    );
    c.bench_function("publish_cycle_pub_only", |b| b.iter(|| p.publish(false)));

    // The floor of the SHM sink: one exclusive flock and its unlock, two syscalls.
    let f = std::fs::File::create(dir.join("lock")).unwrap();
    c.bench_function("flock_lock_unlock (SHM floor)", |b| {
        b.iter(|| {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor for the duration of the call.
            unsafe {
                libc::flock(f.as_raw_fd(), libc::LOCK_EX);
                libc::flock(f.as_raw_fd(), libc::LOCK_UN);
            }
        })
    });

    let s4 = snap.clone();
    c.bench_function("snapshot_clone (collection stand-in)", |b| {
        b.iter(|| s4.clone())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, cycle);
criterion_main!(benches);
