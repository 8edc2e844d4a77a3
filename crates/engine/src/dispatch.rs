//! The internal DP dispatcher: which rank a new request goes to. It reads the ranks' loads from
//! the **SHM sink** (the slot file every rank's `Publisher` writes first), so the internal sink is
//! genuinely consumed, and corrects each rank's load by what it dispatched there since that rank's
//! last snapshot, so a burst between two snapshots is spread instead of piled on one rank.
//!
//! A request whose client chose the rank ([`crate::routed`]) bypasses the pick but is still
//! counted on its rank ([`Dispatcher::count_routed`]): a routed burst between two snapshots is
//! load the next unrouted request must see. (SGLang's controller returns before its budget for a
//! routed request; counting it is the simulator's choice, and only changes who the dispatcher
//! picks, never where a routed request runs.)

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
        let snaps = self.slots();
        let mut d = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.rr.fetch_add(1, Ordering::Relaxed) as usize;
        let mut best = (i64::MAX, 0);
        for k in 0..n {
            let r = (start + k) % n;
            let load = since_snapshot(&mut d[r], &snaps, r);
            let score = load + d[r].1;
            if score < best.0 {
                best = (score, r);
            }
        }
        d[best.1].1 += 1;
        best.1
    }

    /// A request the client routed to `rank` (in range): counted there until the rank's next
    /// snapshot, as if the dispatcher had picked it.
    pub(crate) fn count_routed(&self, rank: usize) {
        if self.ranks == 1 || rank >= self.ranks {
            return;
        }
        let snaps = self.slots();
        let mut d = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
        since_snapshot(&mut d[rank], &snaps, rank);
        d[rank].1 += 1;
    }

    /// Every rank's SHM slot (`None` for a rank that has not published).
    fn slots(&self) -> Vec<Option<LoadSnapshot>> {
        self.shm
            .as_ref()
            .and_then(|s| s.snapshots().ok())
            .unwrap_or_default()
    }

    pub(crate) fn snapshots(&self) -> Vec<LoadSnapshot> {
        self.slots().into_iter().flatten().collect()
    }
}

/// Rank `r`'s running + waiting per its latest snapshot; a new snapshot (a new timestamp) already
/// counts what was dispatched before it, so the rank's correction `entry.1` starts again at 0.
fn since_snapshot(entry: &mut (f64, i64), snaps: &[Option<LoadSnapshot>], r: usize) -> i64 {
    let (load, ts) = snaps.get(r).and_then(Option::as_ref).map_or((0, 0.0), |s| {
        (s.num_running_reqs + s.num_waiting_reqs, s.timestamp())
    });
    if ts != entry.0 {
        *entry = (ts, 0);
    }
    load
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without snapshots every rank reads as idle, so only the corrections decide: requests
    /// routed to rank 0 steer the next picks to rank 1 until the counts level.
    #[test]
    fn routed_requests_count_in_the_correction() {
        let d = Dispatcher::new(2, None);
        d.count_routed(0);
        d.count_routed(0);
        assert_eq!([d.pick_rank(), d.pick_rank()], [1, 1]);
        d.count_routed(7); // out of range: ignored
        let picks: Vec<usize> = (0..4).map(|_| d.pick_rank()).collect();
        assert_eq!(picks.iter().filter(|&&r| r == 0).count(), 2, "{picks:?}");
    }
}
