//! The snapshot side of a KV-event stream: a DEALER asks a publisher's replay ROUTER for a
//! `snapshot-v1` cut and reads the replies up to `end` (or `error`), checking as it goes what
//! every answer must satisfy (one barrier id, parents before children, counts that agree).

use loadlink_wire::kv_snapshot::{
    SNAPSHOT_REQUEST, SnapshotHeader, SnapshotRecord, SnapshotReply, decode_reply,
};
use std::collections::HashSet;

/// A whole snapshot answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub header: SnapshotHeader,
    pub records: Vec<SnapshotRecord>,
}

impl Snapshot {
    /// Every block of every record, sorted (comparable with `/cache_blocks`).
    pub fn blocks(&self) -> Vec<i64> {
        let mut b: Vec<i64> = self
            .records
            .iter()
            .flat_map(|r| r.blocks.iter().copied())
            .collect();
        b.sort_unstable();
        b
    }
}

/// A DEALER connected to the replay socket at `tcp://127.0.0.1:port`.
pub fn snapshot_dealer(ctx: &zmq::Context, port: u16) -> zmq::Socket {
    let dealer = ctx.socket(zmq::DEALER).expect("a DEALER socket");
    dealer.set_linger(0).expect("linger");
    dealer
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .expect("connect the DEALER");
    dealer
}

/// Sends the snapshot request on `dealer`.
pub fn ask_snapshot(dealer: &zmq::Socket) {
    dealer
        .send_multipart([&b""[..], SNAPSHOT_REQUEST], 0)
        .expect("send the snapshot request");
}

/// Reads one snapshot answer from `dealer`: `Ok` with the header and records, `Err(reason)` for
/// an `error` reply. Panics on a malformed answer, a broken invariant, or no reply within 10 s.
pub fn read_snapshot(dealer: &zmq::Socket) -> Result<Snapshot, String> {
    let next = || {
        let ready = dealer.poll(zmq::POLLIN, 10_000).expect("poll");
        assert!(ready > 0, "no snapshot reply within 10 s");
        let f = dealer.recv_multipart(0).expect("a snapshot reply");
        assert_eq!(f.len(), 3, "snapshot reply: [empty, kind, payload]: {f:?}");
        assert!(f[0].is_empty(), "the delimiter frame is empty");
        decode_reply(&f[1], &f[2]).unwrap_or_else(|e| panic!("snapshot reply: {e}"))
    };
    let header = match next() {
        SnapshotReply::Header(h) => h,
        SnapshotReply::Error { reason } => return Err(reason),
        other => panic!("expected a header first, got {other:?}"),
    };
    let mut records = Vec::new();
    let mut seen: HashSet<i64> = HashSet::new();
    loop {
        match next() {
            SnapshotReply::Chunk {
                barrier_id,
                records: chunk,
            } => {
                assert_eq!(barrier_id, header.barrier_id, "a chunk of another cut");
                for r in &chunk {
                    assert!(
                        r.parent.is_none_or(|p| seen.contains(&p)),
                        "record {r:?}: its parent is not a block of an earlier record"
                    );
                    seen.extend(r.blocks.iter().copied());
                }
                records.extend(chunk);
            }
            SnapshotReply::End {
                barrier_id,
                record_count,
            } => {
                assert_eq!(barrier_id, header.barrier_id, "the end of another cut");
                assert_eq!(record_count, header.record_count);
                assert_eq!(record_count, records.len() as u64, "records sent");
                return Ok(Snapshot { header, records });
            }
            other => panic!("expected a chunk or the end, got {other:?}"),
        }
    }
}

/// Asks the replay socket at `tcp://127.0.0.1:port` for a snapshot and reads the answer.
pub fn snapshot(port: u16) -> Result<Snapshot, String> {
    let ctx = zmq::Context::new();
    let dealer = snapshot_dealer(&ctx, port);
    ask_snapshot(&dealer);
    read_snapshot(&dealer)
}
