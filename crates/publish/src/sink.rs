//! The `Sink` trait: one destination for a rank's load. Sinks only write; the `Publisher` alone
//! decides when each sink is due (one owner of cadence).

use loadlink_wire::LoadSnapshot;
use thiserror::Error;

/// A collected snapshot and its msgpack bytes, encoded once per cycle and shared by every sink.
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a> {
    pub snapshot: &'a LoadSnapshot,
    pub bytes: &'a [u8],
}

/// What happened to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Handed to the transport.
    Sent,
    /// The transport was full and the snapshot was shed (a newer one supersedes it).
    Dropped,
    /// Nothing to send (generation B: unchanged stat within its heartbeat).
    Skipped,
}

#[derive(Debug, Error)]
pub enum SinkError {
    #[error("snapshot dp_rank {got} does not match this sink's rank {expected}")]
    WrongRank { expected: i64, got: i64 },
    #[error("{0}")]
    Shm(#[from] loadlink_wire::shm::ShmError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("zmq: {0}")]
    Zmq(#[from] zmq::Error),
    #[error("{0}")]
    Config(String),
    #[error("sink closed")]
    Closed,
}

/// One destination for load snapshots.
pub trait Sink: Send {
    /// A short stable name for logs and metrics (`shm`, `push`, `pub`).
    fn name(&self) -> &'static str;
    /// Publish every this many `publish()` calls (≥ 1) unless forced.
    fn interval(&self) -> u32;
    /// Whether this sink serves in-engine consumers (losing it is an error, not a warning).
    fn internal(&self) -> bool;
    fn write(&mut self, snap: Encoded<'_>) -> Result<WriteOutcome, SinkError>;
    /// Releases the transport; later writes fail with `Closed`.
    fn close(&mut self);
}
