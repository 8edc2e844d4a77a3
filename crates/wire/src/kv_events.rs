//! The KV-event stream's payload: `KVEventBatch` and its three events, byte-compatible with SGLang
//! 0.5.23 (`disaggregation/kv_events.py`) and vLLM, which use the same encoding.
//!
//! A batch is a msgspec `array_like` struct without `omit_defaults`: always the positional array
//! `[ts, events, attn_dp_rank]` (rank nil when unset). Each event is a msgspec tagged struct with
//! `omit_defaults`: a map whose first key is `type` (the class name), then the fields in declaration
//! order. A field whose default is `None` is left out while it is `None`; a field without a default
//! (`parent_block_hash`, `lora_id`) is always written, as nil when unset. Ints take their smallest
//! form and `ts` is a float64, as msgspec writes them.
//!
//! Block hashes are signed 64-bit ids; how the engine derives them is its business (see
//! [`block_hash`]). Decoding is tolerant in the same way as the load payloads: any map or array
//! header, unknown keys skipped, a batch's trailing extra elements ignored, an unknown event type an
//! error naming it.

use crate::error::DecodeError;
use crate::msgpack::{KeyBlock, Reader, Token, Writer, key_block};
use serde_json::{Value, json};

/// `BlockStored`: pages newly cached, parent → child, one hash per page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockStored {
    pub block_hashes: Vec<i64>,
    /// The hash of the page before the first one here; `None` at the root.
    pub parent_block_hash: Option<i64>,
    /// The tokens of every page, concatenated (`block_size` per hash).
    pub token_ids: Vec<i64>,
    pub block_size: i64,
    pub lora_id: Option<i64>,
    /// Storage tier; SGLang writes `"GPU"` for device memory.
    pub medium: Option<String>,
    pub cache_salt: Option<String>,
    pub session_id: Option<String>,
    pub lora_name: Option<String>,
}

/// `BlockRemoved`: pages evicted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<i64>,
    pub medium: Option<String>,
}

/// One KV cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    Stored(BlockStored),
    Removed(BlockRemoved),
    /// The whole cache was flushed.
    AllCleared,
}

/// One published batch: the events of one scheduler step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvEventBatch {
    /// Wall clock, seconds since the epoch.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub attn_dp_rank: Option<i64>,
}

const TYPE: KeyBlock = key_block("type");
const STORED: &str = "BlockStored";
const REMOVED: &str = "BlockRemoved";
const CLEARED: &str = "AllBlocksCleared";

/// Appends the msgspec encoding of `b` to `out`.
pub fn encode_kv_batch(b: &KvEventBatch, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    w.array_header(3);
    w.float(b.ts);
    w.array_header(b.events.len());
    for e in &b.events {
        encode_event(e, &mut w);
    }
    match b.attn_dp_rank {
        Some(r) => w.int(r),
        None => w.nil(),
    }
}

fn opt_int(w: &mut Writer<'_>, v: Option<i64>) {
    match v {
        Some(v) => w.int(v),
        None => w.nil(),
    }
}

fn int_list(w: &mut Writer<'_>, v: &[i64]) {
    w.array_header(v.len());
    v.iter().for_each(|&x| w.int(x));
}

/// Optional string fields that default to `None`: written only when set.
fn optional_strs<'a>(
    fields: &'a [(KeyBlock, &'a Option<String>)],
) -> impl Iterator<Item = (&'a KeyBlock, &'a str)> {
    fields
        .iter()
        .filter_map(|(k, v)| v.as_deref().map(|s| (k, s)))
}

fn encode_event(e: &KvEvent, w: &mut Writer<'_>) {
    match e {
        KvEvent::Stored(s) => {
            let optional = [
                (key_block("medium"), &s.medium),
                (key_block("cache_salt"), &s.cache_salt),
                (key_block("session_id"), &s.session_id),
                (key_block("lora_name"), &s.lora_name),
            ];
            w.map_header(6 + optional_strs(&optional).count());
            w.key(&TYPE);
            w.str(STORED);
            w.key(&const { key_block("block_hashes") });
            int_list(w, &s.block_hashes);
            w.key(&const { key_block("parent_block_hash") });
            opt_int(w, s.parent_block_hash);
            w.key(&const { key_block("token_ids") });
            int_list(w, &s.token_ids);
            w.key(&const { key_block("block_size") });
            w.int(s.block_size);
            w.key(&const { key_block("lora_id") });
            opt_int(w, s.lora_id);
            for (k, v) in optional_strs(&optional) {
                w.key(k);
                w.str(v);
            }
        }
        KvEvent::Removed(r) => {
            w.map_header(2 + usize::from(r.medium.is_some()));
            w.key(&TYPE);
            w.str(REMOVED);
            w.key(&const { key_block("block_hashes") });
            int_list(w, &r.block_hashes);
            if let Some(m) = &r.medium {
                w.key(&const { key_block("medium") });
                w.str(m);
            }
        }
        KvEvent::AllCleared => {
            w.map_header(1);
            w.key(&TYPE);
            w.str(CLEARED);
        }
    }
}

/// Convenience: the batch's bytes in a new buffer.
pub fn kv_batch_bytes(b: &KvEventBatch) -> Vec<u8> {
    let mut v = Vec::with_capacity(64 + b.events.len() * 64);
    encode_kv_batch(b, &mut v);
    v
}

fn wrong(field: &'static str, expected: &'static str, t: Token<'_>) -> DecodeError {
    DecodeError::WrongType {
        field,
        expected,
        got: t.kind(),
    }
}

fn read_int(r: &mut Reader<'_>, field: &'static str) -> Result<i64, DecodeError> {
    crate::codec::int(field, r.next()?)
}

fn read_opt_int(r: &mut Reader<'_>, field: &'static str) -> Result<Option<i64>, DecodeError> {
    match r.next()? {
        Token::Nil => Ok(None),
        t => crate::codec::int(field, t).map(Some),
    }
}

fn read_opt_str(r: &mut Reader<'_>, field: &'static str) -> Result<Option<String>, DecodeError> {
    match r.next()? {
        Token::Nil => Ok(None),
        Token::Str(s) => Ok(Some(String::from_utf8_lossy(s).into_owned())),
        t => Err(wrong(field, "str or nil", t)),
    }
}

fn read_int_list(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<i64>, DecodeError> {
    let n = match r.next()? {
        Token::Array(n) => n,
        t => return Err(wrong(field, "array of ints", t)),
    };
    if n > r.remaining() {
        return Err(DecodeError::Truncated { at: 0 });
    }
    (0..n).map(|_| read_int(r, field)).collect()
}

/// Decodes a `KVEventBatch` (tolerant; see the module docs).
pub fn decode_kv_batch(buf: &[u8]) -> Result<KvEventBatch, DecodeError> {
    let mut r = Reader::new(buf);
    let n = match r.next()? {
        Token::Array(n) if n >= 2 => n,
        Token::Array(n) => {
            return Err(DecodeError::SectionLength {
                section: "KVEventBatch",
                min: 2,
                max: 3,
                got: n,
            });
        }
        t => return Err(wrong("KVEventBatch", "array [ts, events, attn_dp_rank]", t)),
    };
    let ts = crate::codec::float("ts", r.next()?)?;
    let count = match r.next()? {
        Token::Array(c) => c,
        t => return Err(wrong("events", "array", t)),
    };
    if count > r.remaining() {
        return Err(DecodeError::Truncated { at: buf.len() });
    }
    let events = (0..count)
        .map(|_| decode_event(&mut r))
        .collect::<Result<Vec<_>, _>>()?;
    let attn_dp_rank = if n >= 3 {
        read_opt_int(&mut r, "attn_dp_rank")?
    } else {
        None
    };
    for _ in 3..n {
        r.skip()?;
    }
    match r.remaining() {
        0 => Ok(KvEventBatch {
            ts,
            events,
            attn_dp_rank,
        }),
        n => Err(DecodeError::TrailingBytes { trailing: n }),
    }
}

fn decode_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let n = match r.next()? {
        Token::Map(n) => n,
        t => return Err(wrong("event", "tagged map", t)),
    };
    let mut tag: Option<&str> = None;
    let mut stored = BlockStored::default();
    let mut removed_medium = None;
    for _ in 0..n {
        let Some(key) = r.str_key()? else {
            continue;
        };
        match key {
            b"type" => {
                tag = Some(match r.next()? {
                    Token::Str(b) if b == STORED.as_bytes() => STORED,
                    Token::Str(b) if b == REMOVED.as_bytes() => REMOVED,
                    Token::Str(b) if b == CLEARED.as_bytes() => CLEARED,
                    Token::Str(b) => {
                        return Err(DecodeError::UnknownEventType {
                            got: String::from_utf8_lossy(b).into_owned(),
                        });
                    }
                    t => return Err(wrong("type", "str", t)),
                })
            }
            b"block_hashes" => stored.block_hashes = read_int_list(r, "block_hashes")?,
            b"parent_block_hash" => {
                stored.parent_block_hash = read_opt_int(r, "parent_block_hash")?
            }
            b"token_ids" => stored.token_ids = read_int_list(r, "token_ids")?,
            b"block_size" => stored.block_size = read_int(r, "block_size")?,
            b"lora_id" => stored.lora_id = read_opt_int(r, "lora_id")?,
            b"medium" => {
                stored.medium = read_opt_str(r, "medium")?;
                removed_medium.clone_from(&stored.medium);
            }
            b"cache_salt" => stored.cache_salt = read_opt_str(r, "cache_salt")?,
            b"session_id" => stored.session_id = read_opt_str(r, "session_id")?,
            b"lora_name" => stored.lora_name = read_opt_str(r, "lora_name")?,
            _ => r.skip()?,
        }
    }
    match tag {
        Some(STORED) => Ok(KvEvent::Stored(stored)),
        Some(REMOVED) => Ok(KvEvent::Removed(BlockRemoved {
            block_hashes: stored.block_hashes,
            medium: removed_medium,
        })),
        Some(_) => Ok(KvEvent::AllCleared),
        None => Err(DecodeError::WrongType {
            field: "type",
            expected: "an event tag (BlockStored, BlockRemoved, AllBlocksCleared)",
            got: "nothing",
        }),
    }
}

/// The batch as JSON, in msgspec's `to_builtins` shape: `{"ts", "events": [{"type", …}],
/// "attn_dp_rank"}`, optional event fields left out while unset.
pub fn kv_batch_to_json(b: &KvEventBatch) -> Value {
    let events: Vec<Value> = b
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(s) => {
                let mut m = json!({
                    "type": STORED,
                    "block_hashes": s.block_hashes,
                    "parent_block_hash": s.parent_block_hash,
                    "token_ids": s.token_ids,
                    "block_size": s.block_size,
                    "lora_id": s.lora_id,
                });
                for (k, v) in [
                    ("medium", &s.medium),
                    ("cache_salt", &s.cache_salt),
                    ("session_id", &s.session_id),
                    ("lora_name", &s.lora_name),
                ] {
                    if let Some(v) = v {
                        m[k] = json!(v);
                    }
                }
                m
            }
            KvEvent::Removed(r) => {
                let mut m = json!({"type": REMOVED, "block_hashes": r.block_hashes});
                if let Some(v) = &r.medium {
                    m["medium"] = json!(v);
                }
                m
            }
            KvEvent::AllCleared => json!({"type": CLEARED}),
        })
        .collect();
    json!({"ts": b.ts, "events": events, "attn_dp_rank": b.attn_dp_rank})
}

/// The inverse of [`kv_batch_to_json`]; errors name the field.
pub fn kv_batch_from_json(v: &Value) -> Result<KvEventBatch, String> {
    let ints = |e: &Value, k: &str| -> Result<Vec<i64>, String> {
        e.get(k)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{k}: expected a list of integers"))?
            .iter()
            .map(|x| {
                x.as_i64()
                    .ok_or_else(|| format!("{k}: {x} is not an integer"))
            })
            .collect()
    };
    let opt_int = |e: &Value, k: &str| -> Result<Option<i64>, String> {
        match e.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_i64()
                .map(Some)
                .ok_or_else(|| format!("{k}: expected an integer or null, got {x}")),
        }
    };
    let opt_str = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    let events = v
        .get("events")
        .and_then(Value::as_array)
        .ok_or("events: expected a list")?
        .iter()
        .map(|e| match e.get("type").and_then(Value::as_str) {
            Some(STORED) => Ok(KvEvent::Stored(BlockStored {
                block_hashes: ints(e, "block_hashes")?,
                parent_block_hash: opt_int(e, "parent_block_hash")?,
                token_ids: ints(e, "token_ids")?,
                block_size: opt_int(e, "block_size")?.ok_or("block_size: missing")?,
                lora_id: opt_int(e, "lora_id")?,
                medium: opt_str(e, "medium"),
                cache_salt: opt_str(e, "cache_salt"),
                session_id: opt_str(e, "session_id"),
                lora_name: opt_str(e, "lora_name"),
            })),
            Some(REMOVED) => Ok(KvEvent::Removed(BlockRemoved {
                block_hashes: ints(e, "block_hashes")?,
                medium: opt_str(e, "medium"),
            })),
            Some(CLEARED) => Ok(KvEvent::AllCleared),
            other => Err(format!(
                "type: expected BlockStored, BlockRemoved or AllBlocksCleared, got {other:?}"
            )),
        })
        .collect::<Result<_, String>>()?;
    Ok(KvEventBatch {
        ts: v
            .get("ts")
            .and_then(Value::as_f64)
            .ok_or("ts: expected a number")?,
        events,
        attn_dp_rank: opt_int(v, "attn_dp_rank")?,
    })
}

/// SGLang's page hash (`mem_cache/cpp_utils/hash_binding.cpp`, regular token pages): the SHA-256
/// of the previous page's 32-byte digest (absent for the first page) followed by the page's token
/// ids as little-endian u32. Returns the digest, which chains into the next page.
pub fn page_digest(prior: Option<&[u8; 32]>, tokens: &[u32]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    if let Some(p) = prior {
        h.update(p);
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// The event id of a page digest: its first 8 bytes as a big-endian signed i64 (SGLang's
/// `hash_str_to_int64` of the hex digest's first 16 characters).
pub fn block_hash(digest: &[u8; 32]) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(b)
}

/// The block hashes of every full page of `tokens`, chained from the root.
pub fn page_hashes(tokens: &[u32], page_size: usize) -> Vec<i64> {
    crate::kv_namespace::page_hashes_from(tokens, page_size, None)
}

#[cfg(test)]
#[path = "kv_events_tests.rs"]
mod tests;
