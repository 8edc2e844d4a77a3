//! The decisions of one KV-event stream, pure: given the seqs seen so far, what to do with the
//! next live or replayed batch. The socket side ([`super::kv`]) carries them out.
//!
//! * **In order.** Live seq `last + 1` is applied. The first seq of a stream is 0.
//! * **Gap.** A live seq past `last + 1`: ask the engine's replay socket from `last` (not
//!   `last + 1`): the batch at `last` comes back first and its digest is compared with the one
//!   applied, so a restarted engine whose new seqs already passed ours is told apart from a lossy
//!   link. Live batches that arrive meanwhile are held, then replayed through the same rules.
//! * **Restart.** A live seq at or below `last`: a new engine (its cache is new too). The one
//!   exception is a batch the replay already applied arriving late on the live socket (both
//!   sockets race): seqs from where the replay started up to `last` are duplicates until the live
//!   stream has caught up (its next in-order apply).
//! * **Accept next.** After a resync without a usable replay, the next live seq is taken as is.
//! * **Snapshot.** While a snapshot loads, live batches are held as during a replay. A loaded
//!   snapshot stands for every batch up to its barrier seq: the next in-order seq is
//!   `barrier + 1`, held batches at or below the barrier are duplicates, and a replay after it
//!   asks from `barrier + 1` (there is no applied batch to compare an overlap with).
//!
//! Seqs are the peer's numbers: no arithmetic on them may overflow. After `i64::MAX` no seq can
//! follow in order, so any next seq is a repeat (restart or duplicate), never an apply.

/// What to do with a live batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    Apply,
    /// Already applied through a replay.
    Duplicate,
    /// A replay is under way: keep it until it ends.
    Hold,
    /// Seqs from `from` were missed.
    Gap {
        from: i64,
    },
    /// The seq went back: a new engine.
    Restart,
}

/// What to do with a replayed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    Apply,
    /// Already applied (the overlap batch, or older).
    Skip,
    /// The overlap batch differs from what was applied: a new engine.
    Restart,
    /// The replay starts past what is missing: the buffer no longer holds it.
    NotCovered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Replay {
    /// The overlap batch to verify: (seq, digest of what was applied there).
    verify: Option<(i64, u64)>,
    /// The last applied seq when the replay began (to tell whether it made progress).
    began_at: Option<i64>,
}

/// One stream's sequencing state.
#[derive(Debug, Clone, Default)]
pub struct Sequencer {
    last: Option<i64>,
    /// Digest of the batch applied at `last` (`None` when `last` came from a snapshot's barrier).
    digest: Option<u64>,
    /// Live seqs in `[floor, last]` are duplicates of replayed ones (see the module docs).
    dup_floor: Option<i64>,
    replay: Option<Replay>,
    accept_next: bool,
}

impl Sequencer {
    /// The next in-order seq; `None` after `i64::MAX`.
    fn expected(&self) -> Option<i64> {
        self.last.map_or(Some(0), |l| l.checked_add(1))
    }

    /// Nothing applied yet and nothing to accept blindly: a replay from here starts at seq 0.
    pub fn is_fresh(&self) -> bool {
        self.last.is_none() && !self.accept_next
    }

    /// Classifies live seq `seq`.
    pub fn live(&self, seq: i64) -> Live {
        if self.replay.is_some() {
            return Live::Hold;
        }
        if self.accept_next || Some(seq) == self.expected() {
            return Live::Apply;
        }
        match self.last {
            Some(l) if seq <= l => {
                if self.dup_floor.is_some_and(|f| seq >= f) {
                    Live::Duplicate
                } else {
                    Live::Restart
                }
            }
            // seq > last, so last < i64::MAX and expected() is Some.
            _ => Live::Gap {
                from: self.expected().unwrap_or(i64::MAX),
            },
        }
    }

    /// Records that live or replayed batch `seq` (whose bytes digest to `digest`) was applied.
    pub fn applied(&mut self, seq: i64, digest: u64, live: bool) {
        self.last = Some(seq);
        self.digest = Some(digest);
        self.accept_next = false;
        if live {
            self.dup_floor = None;
        }
    }

    /// Forgets everything (after the slot was cleared for a restart): the next seq must be 0.
    pub fn reset(&mut self) {
        *self = Sequencer::default();
    }

    /// Forgets everything and takes the next live seq as it comes (after a resync that no replay
    /// could fill).
    pub fn accept_any_next(&mut self) {
        self.reset();
        self.accept_next = true;
    }

    /// Begins a replay; returns the seq to ask from.
    pub fn begin_replay(&mut self) -> i64 {
        let verify = self.last.zip(self.digest);
        self.replay = Some(Replay {
            verify,
            began_at: self.last,
        });
        self.dup_floor = Some(self.expected().unwrap_or(i64::MAX));
        match verify {
            Some((l, _)) => l,
            None => self.expected().unwrap_or(i64::MAX),
        }
    }

    /// Begins loading a snapshot: live batches are held until [`Sequencer::loaded_snapshot`] or
    /// [`Sequencer::abort_replay`].
    pub fn begin_snapshot(&mut self) {
        self.replay = Some(Replay {
            verify: None,
            began_at: self.last,
        });
    }

    /// A snapshot that reflects every batch up to `barrier` (−1: none) was loaded.
    pub fn loaded_snapshot(&mut self, barrier: i64) {
        *self = Sequencer {
            last: (barrier >= 0).then_some(barrier),
            digest: None,
            // Held live batches at or below the barrier are in the snapshot already.
            dup_floor: Some(i64::MIN),
            replay: None,
            accept_next: false,
        };
    }

    /// Classifies replayed batch `seq` with digest `digest`.
    pub fn replayed(&mut self, seq: i64, digest: u64) -> Replayed {
        let Some(r) = &mut self.replay else {
            return Replayed::Skip;
        };
        // Without the overlap batch (the buffer no longer holds it) continuity cannot be
        // checked: carry on by seq.
        if let Some((vseq, vdigest)) = r.verify.take()
            && seq == vseq
        {
            return if digest == vdigest {
                Replayed::Skip
            } else {
                Replayed::Restart
            };
        }
        match self.expected() {
            Some(e) if seq == e => Replayed::Apply,
            Some(e) if seq > e => Replayed::NotCovered,
            _ => Replayed::Skip,
        }
    }

    /// After `NotCovered` (the slot was cleared): continue from replayed batch `seq`.
    pub fn restart_at(&mut self, seq: i64) {
        self.last = seq.checked_sub(1);
        self.digest = None;
        self.dup_floor = Some(seq);
        if let Some(r) = &mut self.replay {
            r.verify = None;
        }
    }

    /// Ends the replay; returns whether it advanced the stream.
    pub fn end_replay(&mut self) -> bool {
        let began_at = self.replay.take().and_then(|r| r.began_at);
        self.last != began_at
    }

    /// Abandons the replay (timed out, or a restart mid-way).
    pub fn abort_replay(&mut self) {
        self.replay = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_duplicate_restart() {
        let mut s = Sequencer::default();
        assert_eq!(s.live(0), Live::Apply);
        s.applied(0, 10, true);
        assert_eq!(s.live(1), Live::Apply);
        s.applied(1, 11, true);
        assert_eq!(s.live(4), Live::Gap { from: 2 });
        assert_eq!(s.begin_replay(), 1, "from last: verify the overlap");
        assert_eq!(s.live(4), Live::Hold);
        assert_eq!(s.replayed(1, 11), Replayed::Skip);
        for (seq, d) in [(2, 12), (3, 13), (4, 14)] {
            assert_eq!(s.replayed(seq, d), Replayed::Apply);
            s.applied(seq, d, false);
        }
        assert!(s.end_replay());
        assert_eq!(s.live(4), Live::Duplicate, "replayed, then seen live");
        assert_eq!(s.live(2), Live::Duplicate);
        assert_eq!(s.live(5), Live::Apply);
        s.applied(5, 15, true);
        assert_eq!(
            s.live(3),
            Live::Restart,
            "caught up: going back is a restart"
        );
    }

    #[test]
    fn a_different_overlap_is_a_restart_and_a_short_buffer_is_not_covered() {
        let mut s = Sequencer::default();
        s.applied(7, 77, true);
        s.begin_replay();
        assert_eq!(s.replayed(7, 99), Replayed::Restart);
        s.reset();
        assert_eq!(s.begin_replay(), 0);
        assert_eq!(s.replayed(3, 1), Replayed::NotCovered);
        s.restart_at(3);
        assert_eq!(s.replayed(3, 1), Replayed::Apply);
        s.applied(3, 1, false);
        assert!(s.end_replay());
        assert_eq!(s.live(0), Live::Restart, "below the replay's start");
    }

    #[test]
    fn seqs_at_the_ends_of_i64_neither_panic_nor_apply_out_of_order() {
        let mut s = Sequencer::default();
        assert_eq!(s.live(i64::MIN), Live::Gap { from: 0 });
        assert_eq!(s.live(i64::MAX), Live::Gap { from: 0 });
        s.applied(i64::MAX, 1, true);
        assert_eq!(s.live(i64::MAX), Live::Restart, "nothing follows i64::MAX");
        assert_eq!(s.live(i64::MIN), Live::Restart);
        assert_eq!(s.begin_replay(), i64::MAX);
        assert_eq!(s.replayed(i64::MAX, 1), Replayed::Skip, "the overlap");
        assert_eq!(s.replayed(i64::MAX, 2), Replayed::Skip);
        assert_eq!(s.replayed(i64::MIN, 2), Replayed::Skip);
        assert!(!s.end_replay());
        assert_eq!(s.live(i64::MAX), Live::Duplicate, "seen through the replay");
        s.reset();
        s.begin_replay();
        s.restart_at(i64::MIN);
        assert_eq!(s.replayed(i64::MIN, 3), Replayed::Skip);
        s.abort_replay();
        s.applied(i64::MAX - 1, 4, true);
        assert_eq!(s.live(i64::MAX), Live::Apply);
    }

    #[test]
    fn a_loaded_snapshot_stands_for_every_batch_to_its_barrier() {
        let mut s = Sequencer::default();
        s.applied(3, 33, true);
        s.begin_snapshot();
        assert_eq!(s.live(9), Live::Hold, "held while the snapshot loads");
        s.loaded_snapshot(7);
        assert_eq!(
            s.live(5),
            Live::Duplicate,
            "below the barrier: in the snapshot"
        );
        assert_eq!(s.live(7), Live::Duplicate);
        assert_eq!(s.live(9), Live::Gap { from: 8 });
        assert_eq!(
            s.begin_replay(),
            8,
            "no overlap to verify: ask from barrier + 1"
        );
        assert_eq!(s.replayed(8, 1), Replayed::Apply);
        s.applied(8, 1, false);
        assert!(s.end_replay());
        assert_eq!(s.live(9), Live::Apply);
        s.applied(9, 2, true);
        assert_eq!(s.live(4), Live::Restart, "caught up: back is a restart");
        let mut empty = Sequencer::default();
        empty.begin_snapshot();
        empty.loaded_snapshot(-1);
        assert_eq!(empty.live(0), Live::Apply, "an empty engine: seq 0 is next");
    }

    #[test]
    fn accept_next_and_no_progress() {
        let mut s = Sequencer::default();
        s.accept_any_next();
        assert_eq!(s.live(41), Live::Apply);
        s.applied(41, 1, true);
        s.begin_replay();
        assert_eq!(s.replayed(41, 1), Replayed::Skip);
        assert!(!s.end_replay(), "nothing new");
        assert_eq!(s.live(0), Live::Restart);
    }
}
