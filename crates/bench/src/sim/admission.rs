//! Admission control in virtual time: the router's own pure rules
//! (`loadlink_router::admission::rules`: the gate, the capped pick, the queue's room), so the
//! overload evidence measures the code that runs in `loadlink route`, not a re-implementation.
//! Only the queue itself (a FIFO in virtual time) lives here.
//!
//! * **The gate** is production's: a request is admitted when some worker is within the caps of
//!   the production [`Capped`] view (a cap on a figure the book does not know does not apply), and
//!   the policy then picks over the capped view (over the whole view if it declines), as
//!   `proxy::pick` does.
//! * **Reject mode**: a request refused at the gate gets 429 at once. Its client sends it again
//!   after the refusal's `Retry-After` (production's [`retry_after_s`] of the gate's hint), up to
//!   [`SimConfig::client_retries`](super::SimConfig::client_retries) times, as the OpenAI SDK
//!   does (2 retries, honouring a `Retry-After` of up to 60 s); after that it is counted as
//!   rejected, never sent and never completed, and a closed-loop session ends there. A retry's
//!   TTFT counts from the first attempt.
//! * **Queue mode** (the model): each router replica has a FIFO of at most `size` requests.
//!   A refused request joins it, or is rejected when it is full. Every [`QUEUE_POLL_S`] of virtual
//!   time (production's poll period) the head is re-priced on the replica's current book and
//!   cache; while the head passes the gate it is dispatched and the next becomes head. An entry
//!   still queued `timeout_ms` after it arrived is refused (deadlines are in FIFO order, so only
//!   the head can be due), and retried as in reject mode (`Retry-After: 1`, as production
//!   sends). As in production, a new arrival that passes the gate is admitted at
//!   once, ahead of the queue. Its TTFT counts from its arrival, queue time included.

pub use loadlink_router::admission::rules::{gate, open, pick};

use super::{Ev, Sim};
use loadlink_router::admission::rules::{queue_has_room, retry_after_s};
use loadlink_router::admission::{AdmissionConfig, Overload};
use std::collections::VecDeque;

/// How often the head of a replica's queue is re-priced (production polls every 5 ms).
pub const QUEUE_POLL_S: f64 = 0.005;

/// What happens to a request the gate refused on arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Rejected (reject mode, or the queue is full).
    Rejected,
    /// Queued; the caller must make sure the replica's head is polled.
    Queued,
}

/// One router replica's admission FIFO: (request index, virtual deadline).
#[derive(Debug, Default)]
pub struct AdmissionQueue {
    entries: VecDeque<(usize, f64)>,
    /// Whether a poll of this queue is scheduled.
    pub poll_pending: bool,
}

impl AdmissionQueue {
    /// A request refused at `t`: queued (queue mode, room left) or rejected.
    pub fn refuse(&mut self, cfg: &AdmissionConfig, i: usize, t: f64) -> Refused {
        match cfg.overload {
            Overload::Queue { timeout_ms, .. } if queue_has_room(cfg, self.entries.len()) => {
                self.entries.push_back((i, t + timeout_ms as f64 / 1e3));
                Refused::Queued
            }
            _ => Refused::Rejected,
        }
    }

    /// Removes the entries whose deadline has passed at `t`; returns how many.
    /// Drops the entries past their deadline at `t`; their arrivals' indices.
    pub fn expire(&mut self, t: f64) -> Vec<usize> {
        let mut gone = Vec::new();
        while let Some(&(i, d)) = self.entries.front() {
            if d > t {
                break;
            }
            gone.push(i);
            self.entries.pop_front();
        }
        gone
    }

    pub fn head(&self) -> Option<usize> {
        self.entries.front().map(|e| e.0)
    }

    pub fn pop(&mut self) {
        self.entries.pop_front();
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Sim<'_> {
    /// The head of replica `r`'s admission queue, re-priced at `t`: dispatched while it passes the
    /// gate; entries past their deadline rejected; polled again later while any are left.
    pub(super) fn poll_admission(&mut self, r: usize, t: f64) {
        self.admit[r].poll_pending = false;
        loop {
            for i in self.admit[r].expire(t) {
                self.refused(i, t, None);
            }
            let Some(i) = self.admit[r].head() else {
                return;
            };
            let submit = self.submit_of(i);
            match self.route(i, &submit, t, false) {
                Some(engine) => {
                    self.admit[r].pop();
                    self.start(i, engine, submit, t);
                }
                None => break,
            }
        }
        self.schedule_poll(r, t);
    }

    /// Request `i` got a 429 at `t` with `Retry-After` from `hint` (the gate's best predicted
    /// TTFT): its client sends it again then, or gives up once its retries are spent.
    pub(super) fn refused(&mut self, i: usize, t: f64, hint: Option<f64>) {
        if self.reqs[i].retries >= self.cfg.client_retries {
            return self.reject(i);
        }
        self.reqs[i].retries += 1;
        self.out.retried += 1;
        self.push(t + retry_after_s(hint) as f64, Ev::Arrive(i));
    }

    pub(super) fn schedule_poll(&mut self, r: usize, t: f64) {
        if !self.admit[r].is_empty() && !self.admit[r].poll_pending {
            self.admit[r].poll_pending = true;
            self.push(t + QUEUE_POLL_S, Ev::AdmitPoll(r));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_cfg(size: usize, timeout_ms: u64) -> AdmissionConfig {
        AdmissionConfig {
            max_engine_requests: Some(1),
            overload: Overload::Queue { size, timeout_ms },
            ..Default::default()
        }
    }

    #[test]
    fn a_full_queue_rejects_and_deadlines_expire_in_order() {
        let cfg = queue_cfg(2, 100);
        let mut q = AdmissionQueue::default();
        assert_eq!(q.refuse(&cfg, 7, 0.0), Refused::Queued);
        assert_eq!(q.refuse(&cfg, 8, 0.05), Refused::Queued);
        assert_eq!(q.refuse(&cfg, 9, 0.06), Refused::Rejected, "full");
        assert_eq!(q.head(), Some(7));
        assert!(q.expire(0.099).is_empty());
        assert_eq!(
            q.expire(0.1),
            [7],
            "the head's deadline is its arrival + 100 ms"
        );
        assert_eq!(q.head(), Some(8));
        assert_eq!(q.expire(1.0), [8]);
        assert!(q.is_empty());
    }

    #[test]
    fn reject_mode_never_queues() {
        let cfg = AdmissionConfig {
            max_engine_requests: Some(1),
            ..Default::default()
        };
        let mut q = AdmissionQueue::default();
        assert_eq!(q.refuse(&cfg, 1, 0.0), Refused::Rejected);
        assert!(q.is_empty());
    }
}
