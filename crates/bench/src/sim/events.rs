//! The simulator's event queue entries: what happens, and when (earliest first, ties in insertion
//! order, so a run is deterministic). An `engine` here is one scheduler: a DP rank of an engine
//! (`ranks::Layout` numbers them).

use loadlink_wire::LoadSnapshot;
use loadlink_wire::kv_events::KvEvent;
use std::cmp::Ordering;
use std::rc::Rc;

#[derive(Debug)]
pub(super) enum Ev {
    Arrive(usize),
    StepDone(usize),
    Deliver {
        router: usize,
        engine: usize,
        seq: i64,
        snap: Box<LoadSnapshot>,
    },
    Kv {
        router: usize,
        engine: usize,
        events: Rc<Vec<KvEvent>>,
    },
    Heartbeat(usize),
    Sample,
    /// Re-price the head of a router replica's admission queue.
    AdmitPoll(usize),
    /// A PD request's KV reached its decode engine (`super::pd`).
    Transferred(usize),
    /// Replica `router` polls engine `engine` (under `LoadDelivery::Poll`).
    Poll {
        router: usize,
        engine: usize,
    },
}

pub(super) struct Item {
    pub(super) t: f64,
    pub(super) order: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    /// Reversed: `BinaryHeap` pops the earliest event (ties in insertion order).
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.order.cmp(&self.order))
    }
}
