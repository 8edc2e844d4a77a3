//! Decoding snapshot replies: bounded, never panics, every error names the field at fault (see the
//! parent module's docs for the shapes).

use super::*;
use crate::msgpack::{Reader, Token};

fn wrong(field: &'static str, expected: &'static str, t: Token<'_>) -> SnapshotError {
    SnapshotError::Decode(DecodeError::WrongType {
        field,
        expected,
        got: t.kind(),
    })
}

fn read_u64(r: &mut Reader<'_>, field: &'static str) -> Result<u64, SnapshotError> {
    match r.next()? {
        Token::Int(v) if v >= 0 => Ok(v as u64),
        Token::BigUint(v) => Ok(v),
        Token::Int(v) => Err(SnapshotError::OutOfRange {
            field,
            expected: "a non-negative int",
            got: v.to_string(),
        }),
        t => Err(wrong(field, "int", t)),
    }
}

fn read_u32(r: &mut Reader<'_>, field: &'static str) -> Result<u32, SnapshotError> {
    let v = read_u64(r, field)?;
    u32::try_from(v).map_err(|_| SnapshotError::OutOfRange {
        field,
        expected: "an int below 2^32",
        got: v.to_string(),
    })
}

fn read_i64(r: &mut Reader<'_>, field: &'static str) -> Result<i64, SnapshotError> {
    Ok(crate::codec::int(field, r.next()?)?)
}

fn read_str<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
    max: usize,
) -> Result<&'a str, SnapshotError> {
    match r.next()? {
        Token::Str(s) if s.len() > max => Err(SnapshotError::TooLarge {
            field,
            len: s.len(),
            max,
        }),
        Token::Str(s) => std::str::from_utf8(s).map_err(|_| SnapshotError::OutOfRange {
            field,
            expected: "UTF-8 text",
            got: format!("{} bytes of invalid UTF-8", s.len()),
        }),
        t => Err(wrong(field, "str", t)),
    }
}

/// The entry count of a map payload.
fn map_len(r: &mut Reader<'_>, kind: &'static str) -> Result<usize, SnapshotError> {
    match r.next()? {
        Token::Map(n) if n.saturating_mul(2) <= r.remaining() => Ok(n),
        Token::Map(_) => Err(DecodeError::Truncated { at: 0 }.into()),
        t => Err(wrong(kind, "map", t)),
    }
}

fn finish(r: &Reader<'_>) -> Result<(), SnapshotError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(DecodeError::TrailingBytes { trailing: n }.into()),
    }
}

fn need<T>(v: Option<T>, kind: &'static str, field: &'static str) -> Result<T, SnapshotError> {
    v.ok_or(SnapshotError::Missing { kind, field })
}

/// Decodes one reply from its kind frame and payload.
pub fn decode_reply(kind: &[u8], payload: &[u8]) -> Result<SnapshotReply, SnapshotError> {
    let mut r = Reader::new(payload);
    let reply = match kind {
        KIND_HEADER => SnapshotReply::Header(decode_header(&mut r)?),
        KIND_CHUNK => decode_chunk(&mut r)?,
        KIND_END => decode_end(&mut r)?,
        KIND_ERROR => decode_error(&mut r)?,
        other => {
            let shown = &other[..other.len().min(32)];
            return Err(SnapshotError::UnknownKind {
                got: String::from_utf8_lossy(shown).into_owned(),
            });
        }
    };
    finish(&r)?;
    Ok(reply)
}

fn decode_header(r: &mut Reader<'_>) -> Result<SnapshotHeader, SnapshotError> {
    const K: &str = "header";
    let n = map_len(r, K)?;
    let (mut version, mut epoch, mut rank, mut barrier, mut resume) =
        (None, None, None, None, None);
    let (mut id, mut count, mut page, mut schema) = (None, None, None, None);
    for _ in 0..n {
        let Some(key) = r.str_key()? else {
            continue;
        };
        match key {
            b"version" => version = Some(read_u32(r, "version")?),
            b"epoch" => epoch = Some(read_u64(r, "epoch")?),
            b"replica_rank" => rank = Some(read_u32(r, "replica_rank")?),
            b"barrier_seq" => barrier = Some(read_i64(r, "barrier_seq")?),
            b"resume_seq" => resume = Some(read_i64(r, "resume_seq")?),
            b"barrier_id" => id = Some(read_u64(r, "barrier_id")?),
            b"record_count" => count = Some(read_u64(r, "record_count")?),
            b"page_size" => page = Some(read_u32(r, "page_size")?),
            b"hash_schema_version" => schema = Some(read_u32(r, "hash_schema_version")?),
            _ => r.skip()?,
        }
    }
    let version = need(version, K, "version")?;
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::OutOfRange {
            field: "version",
            expected: "1",
            got: version.to_string(),
        });
    }
    let barrier_seq = need(barrier, K, "barrier_seq")?;
    if barrier_seq < -1 {
        return Err(SnapshotError::OutOfRange {
            field: "barrier_seq",
            expected: "-1 or a seq >= 0",
            got: barrier_seq.to_string(),
        });
    }
    let resume_seq = need(resume, K, "resume_seq")?;
    if Some(resume_seq) != barrier_seq.checked_add(1) {
        return Err(SnapshotError::OutOfRange {
            field: "resume_seq",
            expected: "barrier_seq + 1",
            got: resume_seq.to_string(),
        });
    }
    if page == Some(0) {
        return Err(SnapshotError::OutOfRange {
            field: "page_size",
            expected: "a positive int",
            got: "0".into(),
        });
    }
    Ok(SnapshotHeader {
        version,
        epoch: need(epoch, K, "epoch")?,
        replica_rank: rank.unwrap_or(0),
        barrier_seq,
        resume_seq,
        barrier_id: need(id, K, "barrier_id")?,
        record_count: need(count, K, "record_count")?,
        page_size: page,
        hash_schema_version: schema,
    })
}

fn decode_chunk(r: &mut Reader<'_>) -> Result<SnapshotReply, SnapshotError> {
    const K: &str = "chunk";
    let n = map_len(r, K)?;
    let (mut id, mut records) = (None, None);
    for _ in 0..n {
        let Some(key) = r.str_key()? else {
            continue;
        };
        match key {
            b"barrier_id" => id = Some(read_u64(r, "barrier_id")?),
            b"records" => records = Some(decode_records(r)?),
            _ => r.skip()?,
        }
    }
    Ok(SnapshotReply::Chunk {
        barrier_id: need(id, K, "barrier_id")?,
        records: need(records, K, "records")?,
    })
}

fn decode_records(r: &mut Reader<'_>) -> Result<Vec<SnapshotRecord>, SnapshotError> {
    let n = match r.next()? {
        Token::Array(n) => n,
        t => return Err(wrong("records", "array of records", t)),
    };
    // Each record holds at least one block, so the block bound also bounds the records.
    if n > MAX_CHUNK_BLOCKS {
        return Err(SnapshotError::TooLarge {
            field: "records",
            len: n,
            max: MAX_CHUNK_BLOCKS,
        });
    }
    if n.saturating_mul(3) > r.remaining() {
        return Err(DecodeError::Truncated { at: 0 }.into());
    }
    let mut budget = MAX_CHUNK_BLOCKS;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let rec = decode_record(r, budget)?;
        budget -= rec.blocks.len();
        out.push(rec);
    }
    Ok(out)
}

/// One record; `budget` is how many blocks the chunk may still carry.
fn decode_record(r: &mut Reader<'_>, budget: usize) -> Result<SnapshotRecord, SnapshotError> {
    let len = match r.next()? {
        Token::Array(len @ 2..=3) => len,
        Token::Array(len) => {
            return Err(SnapshotError::OutOfRange {
                field: "record",
                expected: "an array [parent, blocks] or [parent, blocks, medium]",
                got: format!("an array of {len}"),
            });
        }
        t => return Err(wrong("record", "array [parent, blocks(, medium)]", t)),
    };
    let parent = match r.next()? {
        Token::Nil => None,
        t => Some(crate::codec::int("parent_block_hash", t)?),
    };
    let count = match r.next()? {
        Token::Array(c) => c,
        t => return Err(wrong("block_hashes", "array of ints", t)),
    };
    if count == 0 {
        return Err(SnapshotError::OutOfRange {
            field: "block_hashes",
            expected: "at least one block",
            got: "an empty array".into(),
        });
    }
    if count > budget {
        return Err(SnapshotError::TooLarge {
            field: "block_hashes",
            len: MAX_CHUNK_BLOCKS - budget + count,
            max: MAX_CHUNK_BLOCKS,
        });
    }
    if count > r.remaining() {
        return Err(DecodeError::Truncated { at: 0 }.into());
    }
    let blocks = (0..count)
        .map(|_| read_i64(r, "block_hashes"))
        .collect::<Result<Vec<_>, _>>()?;
    let medium = if len == 3 {
        match r.peek() {
            Some(0xc0) => {
                r.next()?;
                None
            }
            _ => Some(read_str(r, "medium", MAX_MEDIUM_LEN)?.to_owned()),
        }
    } else {
        None
    };
    Ok(SnapshotRecord {
        parent,
        blocks,
        medium,
    })
}

fn decode_end(r: &mut Reader<'_>) -> Result<SnapshotReply, SnapshotError> {
    const K: &str = "end";
    let n = map_len(r, K)?;
    let (mut id, mut count) = (None, None);
    for _ in 0..n {
        let Some(key) = r.str_key()? else {
            continue;
        };
        match key {
            b"barrier_id" => id = Some(read_u64(r, "barrier_id")?),
            b"record_count" => count = Some(read_u64(r, "record_count")?),
            _ => r.skip()?,
        }
    }
    Ok(SnapshotReply::End {
        barrier_id: need(id, K, "barrier_id")?,
        record_count: need(count, K, "record_count")?,
    })
}

fn decode_error(r: &mut Reader<'_>) -> Result<SnapshotReply, SnapshotError> {
    let n = map_len(r, "error")?;
    let mut reason = None;
    for _ in 0..n {
        let Some(key) = r.str_key()? else {
            continue;
        };
        match key {
            b"reason" => reason = Some(read_str(r, "reason", MAX_REASON_LEN)?.to_owned()),
            _ => r.skip()?,
        }
    }
    Ok(SnapshotReply::Error {
        reason: need(reason, "error", "reason")?,
    })
}
