//! KV snapshots (`snapshot-v1`) and the epoch suffix of the KV-event topic frame.
//!
//! Why: a router that joins late (or saw a gap its replay buffer cannot cover) needs the engine's
//! whole cache at one point of the event stream. The engine answers on its per-rank replay ROUTER:
//! a DEALER sends `[b"", b"snapshot-v1"]` (a replay request's second frame is 8 bytes, so the two
//! cannot be confused) and receives three-frame replies `[b"", kind, msgpack payload]`:
//!
//! * `header`: `{version: 1, epoch, replica_rank, barrier_seq, resume_seq, barrier_id,
//!   record_count, page_size, hash_schema_version: 1}`, with `resume_seq == barrier_seq + 1`;
//! * `chunk`s: `{barrier_id, records: [[parent|nil, [hash, …]] | [parent|nil, [hash, …], medium]]}`,
//!   at most [`MAX_CHUNK_BLOCKS`] blocks per chunk, each record's parent nil or a block of an
//!   earlier record;
//! * `end`: `{barrier_id, record_count}`; or, instead of all of the above, `error`: `{reason}`.
//!
//! The epoch (one per publisher lifetime) also rides on every live and replayed batch as a topic
//! suffix `{topic}\0sgl-kv-epoch={decimal}`, the way SGLang's v2 draft writes it.
//!
//! Decoding is bounded: it never panics, never allocates more than the payload can hold, and each
//! error names the field at fault and the expected form. Maps are read by key (unknown keys are
//! skipped, so a newer engine may add fields); the values of known keys must have the right form.

use crate::error::DecodeError;
use crate::msgpack::{Writer, key_block};
use thiserror::Error;

/// The request's second frame (after the empty delimiter).
pub const SNAPSHOT_REQUEST: &[u8] = b"snapshot-v1";
/// The reply kinds (the frame after the empty delimiter).
pub const KIND_HEADER: &[u8] = b"header";
pub const KIND_CHUNK: &[u8] = b"chunk";
pub const KIND_END: &[u8] = b"end";
pub const KIND_ERROR: &[u8] = b"error";
/// The snapshot format this module reads and writes.
pub const SNAPSHOT_VERSION: u32 = 1;
/// The block-hash scheme: SGLang's chained SHA-256 page digest, first 8 bytes as a BE i64.
pub const HASH_SCHEMA_VERSION: u32 = 1;
/// Most blocks one chunk may carry (over all its records).
pub const MAX_CHUNK_BLOCKS: usize = 4096;
/// Longest `medium` string accepted.
pub const MAX_MEDIUM_LEN: usize = 64;
/// Longest error `reason` accepted.
pub const MAX_REASON_LEN: usize = 4096;
/// The topic-frame marker in front of the epoch's decimal digits.
pub const EPOCH_TOPIC_MARKER: &[u8] = b"\0sgl-kv-epoch=";

/// The first reply: where the cut was made and how many records follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// Always [`SNAPSHOT_VERSION`] on a decoded header.
    pub version: u32,
    /// The publisher lifetime the cut belongs to (ns since the UNIX epoch at bind).
    pub epoch: u64,
    pub replica_rank: u32,
    /// The last KV batch seq assigned before the cut; −1 when none was.
    pub barrier_seq: i64,
    /// `barrier_seq + 1`: where the subscriber continues the live stream or replay.
    pub resume_seq: i64,
    /// Ties the chunks and the end of one answer to its header.
    pub barrier_id: u64,
    /// Records in all the chunks together.
    pub record_count: u64,
    /// Tokens per block; absent from a peer that follows the v1 draft only.
    pub page_size: Option<u32>,
    /// Absent from a peer that follows the v1 draft only.
    pub hash_schema_version: Option<u32>,
}

impl SnapshotHeader {
    /// A header for a cut at `barrier_seq` (`resume_seq` follows from it).
    pub fn new(
        epoch: u64,
        replica_rank: u32,
        barrier_seq: i64,
        barrier_id: u64,
        record_count: u64,
        page_size: u32,
    ) -> Self {
        SnapshotHeader {
            version: SNAPSHOT_VERSION,
            epoch,
            replica_rank,
            barrier_seq,
            resume_seq: barrier_seq.saturating_add(1),
            barrier_id,
            record_count,
            page_size: Some(page_size),
            hash_schema_version: Some(HASH_SCHEMA_VERSION),
        }
    }
}

/// One chain of blocks: `blocks[0]`'s parent is `parent`, each later block's parent the one before.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotRecord {
    pub parent: Option<i64>,
    pub blocks: Vec<i64>,
    /// `None` for device memory (GPU); otherwise the tier, e.g. `"CPU_PINNED"`, `"DISK"`.
    pub medium: Option<String>,
}

/// One decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotReply {
    Header(SnapshotHeader),
    Chunk {
        barrier_id: u64,
        records: Vec<SnapshotRecord>,
    },
    End {
        barrier_id: u64,
        record_count: u64,
    },
    Error {
        reason: String,
    },
}

/// Why a snapshot reply (or its kind frame) was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SnapshotError {
    #[error("reply kind: expected header, chunk, end or error, got {got:?}")]
    UnknownKind { got: String },
    #[error("{kind}: missing field `{field}`")]
    Missing {
        kind: &'static str,
        field: &'static str,
    },
    #[error("field `{field}`: expected {expected}, got {got}")]
    OutOfRange {
        field: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error("field `{field}`: {len} exceeds the bound of {max}")]
    TooLarge {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

impl From<crate::msgpack::ReadError> for SnapshotError {
    fn from(e: crate::msgpack::ReadError) -> Self {
        SnapshotError::Decode(e.into())
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Appends the `header` payload.
pub fn encode_header(h: &SnapshotHeader, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    let n = 7 + usize::from(h.page_size.is_some()) + usize::from(h.hash_schema_version.is_some());
    w.map_header(n);
    w.key(&const { key_block("version") });
    w.uint(h.version.into());
    w.key(&const { key_block("epoch") });
    w.uint(h.epoch);
    w.key(&const { key_block("replica_rank") });
    w.uint(h.replica_rank.into());
    w.key(&const { key_block("barrier_seq") });
    w.int(h.barrier_seq);
    w.key(&const { key_block("resume_seq") });
    w.int(h.resume_seq);
    w.key(&const { key_block("barrier_id") });
    w.uint(h.barrier_id);
    w.key(&const { key_block("record_count") });
    w.uint(h.record_count);
    if let Some(p) = h.page_size {
        w.key(&const { key_block("page_size") });
        w.uint(p.into());
    }
    if let Some(v) = h.hash_schema_version {
        w.key(&const { key_block("hash_schema_version") });
        w.uint(v.into());
    }
}

/// Appends one record: `[parent, [blocks]]`, or `[parent, [blocks], medium]` off the device tier.
pub fn encode_record(parent: Option<i64>, blocks: &[i64], medium: Option<&str>, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    w.array_header(2 + usize::from(medium.is_some()));
    match parent {
        Some(p) => w.int(p),
        None => w.nil(),
    }
    w.array_header(blocks.len());
    for &b in blocks {
        w.int(b);
    }
    if let Some(m) = medium {
        w.str(m);
    }
}

/// Appends the start of a `chunk` payload holding `record_count` records; follow it with exactly
/// that many [`encode_record`] calls. (Lets an encoder write records without building them.)
pub fn encode_chunk_start(barrier_id: u64, record_count: usize, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    w.map_header(2);
    w.key(&const { key_block("barrier_id") });
    w.uint(barrier_id);
    w.key(&const { key_block("records") });
    w.array_header(record_count);
}

/// Appends a whole `chunk` payload. The caller keeps it within [`MAX_CHUNK_BLOCKS`] blocks
/// ([`chunk_records`] does).
pub fn encode_chunk(barrier_id: u64, records: &[SnapshotRecord], out: &mut Vec<u8>) {
    encode_chunk_start(barrier_id, records.len(), out);
    for r in records {
        encode_record(r.parent, &r.blocks, r.medium.as_deref(), out);
    }
}

/// Appends the `end` payload.
pub fn encode_end(barrier_id: u64, record_count: u64, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    w.map_header(2);
    w.key(&const { key_block("barrier_id") });
    w.uint(barrier_id);
    w.key(&const { key_block("record_count") });
    w.uint(record_count);
}

/// Appends the `error` payload; a reason over [`MAX_REASON_LEN`] bytes is cut at a char boundary.
pub fn encode_error(reason: &str, out: &mut Vec<u8>) {
    let mut end = reason.len().min(MAX_REASON_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut w = Writer { out };
    w.map_header(1);
    w.key(&const { key_block("reason") });
    w.str(&reason[..end]);
}

/// Appends `reply`'s payload and returns its kind frame.
pub fn encode_reply(reply: &SnapshotReply, out: &mut Vec<u8>) -> &'static [u8] {
    match reply {
        SnapshotReply::Header(h) => {
            encode_header(h, out);
            KIND_HEADER
        }
        SnapshotReply::Chunk {
            barrier_id,
            records,
        } => {
            encode_chunk(*barrier_id, records, out);
            KIND_CHUNK
        }
        SnapshotReply::End {
            barrier_id,
            record_count,
        } => {
            encode_end(*barrier_id, *record_count, out);
            KIND_END
        }
        SnapshotReply::Error { reason } => {
            encode_error(reason, out);
            KIND_ERROR
        }
    }
}

/// Splits ordered records into chunks of at most [`MAX_CHUNK_BLOCKS`] blocks. A record longer than
/// that is cut into several (each later piece's parent is the block before it), so the
/// parent-before-child order is kept. Empty records are dropped.
pub fn chunk_records(records: Vec<SnapshotRecord>) -> Vec<Vec<SnapshotRecord>> {
    let mut chunks = Vec::new();
    let mut current: Vec<SnapshotRecord> = Vec::new();
    let mut room = MAX_CHUNK_BLOCKS;
    for mut rec in records {
        while !rec.blocks.is_empty() {
            if room == 0 {
                chunks.push(std::mem::take(&mut current));
                room = MAX_CHUNK_BLOCKS;
            }
            if rec.blocks.len() <= room {
                room -= rec.blocks.len();
                current.push(rec);
                break;
            }
            let rest = rec.blocks.split_off(room);
            let parent = rec.blocks.last().copied();
            let medium = rec.medium.clone();
            current.push(rec);
            room = 0;
            rec = SnapshotRecord {
                parent,
                blocks: rest,
                medium,
            };
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

mod decode;
pub use decode::decode_reply;

// ---------------------------------------------------------------------------------------------
// The epoch in the topic frame

/// Appends `{topic}\0sgl-kv-epoch={epoch}` to `out`.
pub fn epoch_topic(topic: &[u8], epoch: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(topic);
    out.extend_from_slice(EPOCH_TOPIC_MARKER);
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut v = epoch;
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Splits a topic frame into the topic and its epoch. A frame without the marker, or whose suffix
/// is not a decimal u64, is returned whole with `None` (a publisher without epochs, e.g. SGLang
/// 0.5.23).
pub fn split_epoch_topic(frame: &[u8]) -> (&[u8], Option<u64>) {
    let m = EPOCH_TOPIC_MARKER;
    let Some(at) = frame.windows(m.len()).rposition(|w| w == m) else {
        return (frame, None);
    };
    let digits = &frame[at + m.len()..];
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return (frame, None);
    }
    let mut v: u64 = 0;
    for d in digits {
        let Some(next) = v
            .checked_mul(10)
            .and_then(|x| x.checked_add(u64::from(d - b'0')))
        else {
            return (frame, None);
        };
        v = next;
    }
    (&frame[..at], Some(v))
}

#[cfg(test)]
#[path = "kv_snapshot_tests.rs"]
mod tests;
