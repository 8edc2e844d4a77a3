//! The internal DP dispatcher: which rank a new request goes to. It reads the ranks' loads from
//! the **SHM sink** (the slot file every rank's `Publisher` writes first), so the internal sink is
//! genuinely consumed, and corrects each rank's load by what it dispatched there since that rank's
//! last snapshot, so a burst between two snapshots is spread instead of piled on one rank.

use loadlink_publish::ShmReader;
use loadlink_wire::LoadSnapshot;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Dispatcher {
    ranks: usize,
    shm: Option<ShmReader>,
    /// Per rank: (timestamp of the snapshot last seen, dispatched since then).
    dispatch: Mutex<Vec<(f64, i64)>>,
    rr: AtomicU64,
}

impl Dispatcher {
    pub(crate) fn new(ranks: usize, shm: Option<ShmReader>) -> Self {
        Dispatcher {
            ranks,
            shm,
            dispatch: Mutex::new(vec![(0.0, 0); ranks]),
            rr: AtomicU64::new(0),
        }
    }

    /// Fewest running + waiting per the SHM slots, plus what was dispatched since each rank's
    /// last snapshot; ties broken round-robin.
    pub(crate) fn pick_rank(&self) -> usize {
        let n = self.ranks;
        if n == 1 {
            return 0;
        }
        let snaps = self
            .shm
            .as_ref()
            .and_then(|s| s.snapshots().ok())
            .unwrap_or_default();
        let mut d = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.rr.fetch_add(1, Ordering::Relaxed) as usize;
        let mut best = (i64::MAX, 0);
        for k in 0..n {
            let r = (start + k) % n;
            let (load, ts) = snaps.get(r).and_then(Option::as_ref).map_or((0, 0.0), |s| {
                (s.num_running_reqs + s.num_waiting_reqs, s.timestamp())
            });
            if ts != d[r].0 {
                d[r] = (ts, 0);
            }
            let score = load + d[r].1;
            if score < best.0 {
                best = (score, r);
            }
        }
        d[best.1].1 += 1;
        best.1
    }

    pub(crate) fn snapshots(&self) -> Vec<LoadSnapshot> {
        self.shm
            .as_ref()
            .and_then(|s| s.snapshots().ok())
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect()
    }
}
