//! A sink that hands each snapshot to an in-process channel: how the discrete-event simulator in
//! `loadlink-bench` publishes through the real [`Publisher`](crate::Publisher), so its cadence is
//! the live engine's. It numbers what it sends as the PUB sink does (0, 1, 2, …).

use crate::sink::{Encoded, Sink, SinkError, WriteOutcome};
use loadlink_wire::LoadSnapshot;
use std::sync::mpsc::{Receiver, Sender, channel};

/// One snapshot the sink sent, with its sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub seq: i64,
    pub snapshot: LoadSnapshot,
}

/// Sends each due snapshot to the [`Receiver`] returned by [`MemorySink::new`].
pub struct MemorySink {
    tx: Option<Sender<Sent>>,
    interval: u32,
    seq: i64,
}

impl MemorySink {
    /// A router-facing sink due every `interval` publisher calls (as `build_sinks` sets the PUB's).
    pub fn new(interval: u32) -> (Self, Receiver<Sent>) {
        let (tx, rx) = channel();
        let sink = MemorySink {
            tx: Some(tx),
            interval: interval.max(1),
            seq: 0,
        };
        (sink, rx)
    }
}

impl Sink for MemorySink {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn interval(&self) -> u32 {
        self.interval
    }

    fn internal(&self) -> bool {
        false
    }

    fn write(&mut self, snap: Encoded<'_>) -> Result<WriteOutcome, SinkError> {
        let tx = self.tx.as_ref().ok_or(SinkError::Closed)?;
        let sent = Sent {
            seq: self.seq,
            snapshot: snap.snapshot.clone(),
        };
        tx.send(sent).map_err(|_| SinkError::Closed)?;
        self.seq += 1;
        Ok(WriteOutcome::Sent)
    }

    fn close(&mut self) {
        self.tx = None;
    }
}
