//! Payload codec: msgspec-exact encoding and tolerant decoding of `LoadSnapshot` and `LoadStat`.
//!
//! Encoding reproduces msgspec 0.22 byte for byte (SGLang 0.5.23's declarations): the snapshot is a
//! map16 with keys in declaration order, zero ints and unset floats omitted, sections as full
//! arrays; the stat is the tagged 11-element array. Decoding is tolerant by design, because the
//! schema grows between engine releases: any map header, unknown keys skipped, missing keys
//! defaulted, ints accepted where floats are declared, short (older) sections and stats accepted.

use crate::error::DecodeError;
use crate::msgpack::key_block;
use crate::msgpack::{Reader, Token, Writer};
use crate::sections::{Section, for_each_section};
use crate::snapshot::*;
use crate::snapshot::{CORE_KEY_BLOCKS, CORE_SCALARS, core_at, core_index};

/// A decoded payload of either generation. (The size difference between the variants is fine:
/// payloads are decoded one at a time and moved at most once.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Snapshot(LoadSnapshot),
    Stat(LoadStat),
}

impl Payload {
    /// The numbers as a snapshot (a stat fills the fields it carries).
    pub fn into_snapshot(self) -> LoadSnapshot {
        match self {
            Payload::Snapshot(s) => s,
            Payload::Stat(s) => s.to_snapshot(),
        }
    }
}

const STAT_TAG: &str = "LoadStat";
const STAT_LEN: usize = 11;

/// Appends the msgspec encoding of `s` to `out`.
pub fn encode_snapshot(s: &LoadSnapshot, out: &mut Vec<u8>) {
    out.reserve(1024);
    let header_at = out.len();
    out.extend_from_slice(&[0xde, 0, 0]);
    let mut w = Writer { out };
    let mut count: u16 = 0;
    for ((_, value), key) in s.core_scalars().into_iter().zip(&CORE_KEY_BLOCKS) {
        match value {
            Scalar::Int(0) | Scalar::Float(None) => continue,
            Scalar::Int(v) => {
                w.key(key);
                w.int(v);
            }
            Scalar::Float(Some(v)) => {
                w.key(key);
                w.float(v);
            }
        }
        count += 1;
    }
    if let Some(m) = &s.decode_moments {
        w.key(&const { key_block("decode_moments") });
        w.array_header(m.len());
        m.iter().for_each(|&v| w.float(v));
        count += 1;
    }
    macro_rules! encode_section {
        ($field:ident: $ty:ty) => {
            if let Some(m) = &s.$field {
                w.key(&<$ty as Section>::KEY_BLOCK);
                m.encode(&mut w);
                count += 1;
            }
        };
    }
    for_each_section!(encode_section);
    out[header_at + 1..header_at + 3].copy_from_slice(&count.to_be_bytes());
}

/// Appends the msgspec encoding of `s` (tagged array, always 11 elements) to `out`.
pub fn encode_stat(s: &LoadStat, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    w.array_header(STAT_LEN);
    w.str(STAT_TAG);
    w.int(s.num_running_reqs);
    w.int(s.num_waiting_reqs);
    w.int(s.num_tokens);
    w.int(s.max_total_num_tokens);
    match s.attn_dp_rank {
        Some(r) => w.int(r),
        None => w.nil(),
    }
    w.int(s.num_waiting_uncached_tokens);
    w.int(s.num_total_tokens);
    w.int(s.max_running_requests);
    w.int(s.total_prefill_uncached_tokens);
    w.int(s.total_prefill_busy_us);
}

/// Convenience: the snapshot's bytes in a new buffer.
pub fn snapshot_bytes(s: &LoadSnapshot) -> Vec<u8> {
    let mut v = Vec::with_capacity(256);
    encode_snapshot(s, &mut v);
    v
}

/// Convenience: the stat's bytes in a new buffer.
pub fn stat_bytes(s: &LoadStat) -> Vec<u8> {
    let mut v = Vec::with_capacity(48);
    encode_stat(s, &mut v);
    v
}

/// Decodes either generation: a map is a snapshot, an array tagged "LoadStat" a stat.
pub fn decode_payload(buf: &[u8]) -> Result<Payload, DecodeError> {
    match Reader::new(buf).peek() {
        Some(0x80..=0x8f | 0xde | 0xdf) => decode_snapshot(buf).map(Payload::Snapshot),
        Some(0x90..=0x9f | 0xdc | 0xdd) => decode_stat(buf).map(Payload::Stat),
        Some(_) => {
            let got = Reader::new(buf)
                .next()
                .map(|t| t.kind())
                .unwrap_or("garbage");
            Err(DecodeError::UnknownPayload { got })
        }
        None => Err(DecodeError::Truncated { at: 0 }),
    }
}

fn finish(r: &Reader<'_>) -> Result<(), DecodeError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(DecodeError::TrailingBytes { trailing: n }),
    }
}

pub(crate) fn int(field: &'static str, t: Token<'_>) -> Result<i64, DecodeError> {
    match t {
        Token::Int(v) => Ok(v),
        Token::BigUint(value) => Err(DecodeError::IntOutOfRange { field, value }),
        other => Err(DecodeError::WrongType {
            field,
            expected: "int",
            got: other.kind(),
        }),
    }
}

pub(crate) fn float(field: &'static str, t: Token<'_>) -> Result<f64, DecodeError> {
    match t {
        Token::Float(v) => Ok(v),
        Token::Int(v) => Ok(v as f64),
        Token::BigUint(v) => Ok(v as f64),
        other => Err(DecodeError::WrongType {
            field,
            expected: "float",
            got: other.kind(),
        }),
    }
}

/// Skips elements past the ones this version knows (newer engines may append).
fn skip_extra(r: &mut Reader<'_>, n: usize, known: usize) -> Result<(), DecodeError> {
    for _ in known..n {
        r.skip()?;
    }
    Ok(())
}

/// Reads the `i`-th of `n` present elements, or the default when the array is shorter.
fn opt_int(
    r: &mut Reader<'_>,
    field: &'static str,
    i: usize,
    n: usize,
) -> Result<i64, DecodeError> {
    if i < n { int(field, r.next()?) } else { Ok(0) }
}

/// Decodes a section's value (an array, or nil for none) into `slot`, reusing the allocations of
/// what `slot` held before.
fn decode_section_value<S: Section>(
    r: &mut Reader<'_>,
    slot: &mut Option<S>,
) -> Result<(), DecodeError> {
    match r.next()? {
        Token::Nil => *slot = None,
        Token::Array(n) if n >= S::MIN => {
            let mut m = slot.take().unwrap_or_default();
            m.decode_into(r, n)?;
            *slot = Some(m);
        }
        Token::Array(n) => {
            return Err(DecodeError::SectionLength {
                section: S::KEY,
                min: S::MIN,
                max: S::LEN,
                got: n,
            });
        }
        other => {
            return Err(DecodeError::WrongType {
                field: S::KEY,
                expected: "array or nil",
                got: other.kind(),
            });
        }
    }
    Ok(())
}

/// Decodes a generation-A snapshot map (tolerant; see module docs).
pub fn decode_snapshot(buf: &[u8]) -> Result<LoadSnapshot, DecodeError> {
    let mut s = LoadSnapshot::default();
    decode_snapshot_into(buf, &mut s)?;
    Ok(s)
}

/// [`decode_snapshot`] into `s`, reusing its two heap fields (`decode_moments`,
/// `disaggregation.mode`): a consumer that keeps one snapshot per rank decodes without allocating
/// once those have grown. Every field of `s` is overwritten; on error `s` holds the fields decoded
/// so far and defaults elsewhere.
pub fn decode_snapshot_into(buf: &[u8], s: &mut LoadSnapshot) -> Result<(), DecodeError> {
    // What `s` held, for its allocations (`decode_moments`, `disaggregation.mode`).
    let mut reuse = std::mem::take(s);
    let mut r = Reader::new(buf);
    let n = match r.next()? {
        Token::Map(n) => n,
        other => {
            return Err(DecodeError::WrongType {
                field: "LoadSnapshot",
                expected: "map",
                got: other.kind(),
            });
        }
    };
    if n > r.remaining() {
        return Err(DecodeError::Truncated { at: buf.len() });
    }
    let mut hint = 0;
    for _ in 0..n {
        let Some(key) = r.str_key()? else {
            continue;
        };
        // In-order core key (the common case) first; then the section names, so a section key
        // does not pay for a scan of every core name; then a core key out of order.
        let in_order = core_at(key, hint);
        if in_order.is_none() && decode_section(s, key, &mut r, &mut reuse)? {
            continue;
        }
        if let Some(idx) = in_order.or_else(|| core_index(key, 0)) {
            hint = idx + 1;
            let name = CORE_SCALARS[idx];
            let t = r.next()?;
            match s.core_scalar_at(idx).expect("index from CORE_SCALARS") {
                ScalarMut::Int(v) => *v = int(name, t)?,
                ScalarMut::Float(v) => *v = Some(float(name, t)?),
            }
            continue;
        }
        r.skip()?;
    }
    finish(&r)
}

/// Decodes the value of section `key` into `s`; `false` (nothing read) when `key` is no section.
fn decode_section(
    s: &mut LoadSnapshot,
    key: &[u8],
    r: &mut Reader<'_>,
    reuse: &mut LoadSnapshot,
) -> Result<bool, DecodeError> {
    if key == b"decode_moments" {
        let moments = reuse.decode_moments.take().unwrap_or_default();
        s.decode_moments = decode_float_list(r, moments)?;
        return Ok(true);
    }
    macro_rules! decode_if_key {
        ($field:ident: $ty:ty) => {
            if key == <$ty as Section>::KEY.as_bytes() {
                s.$field = reuse.$field.take();
                decode_section_value(r, &mut s.$field)?;
                return Ok(true);
            }
        };
    }
    for_each_section!(decode_if_key);
    Ok(false)
}

/// A float list or nil, written into `v` (cleared first; its allocation is reused).
fn decode_float_list(r: &mut Reader<'_>, mut v: Vec<f64>) -> Result<Option<Vec<f64>>, DecodeError> {
    match r.next()? {
        Token::Nil => Ok(None),
        Token::Array(n) => {
            if n > r.remaining() {
                return Err(DecodeError::Truncated { at: 0 });
            }
            v.clear();
            v.reserve(n);
            for _ in 0..n {
                v.push(float("decode_moments", r.next()?)?);
            }
            Ok(Some(v))
        }
        other => Err(DecodeError::WrongType {
            field: "decode_moments",
            expected: "array of floats or nil",
            got: other.kind(),
        }),
    }
}

/// Decodes a generation-B `LoadStat` (tag + at least 5 fields; extra trailing elements ignored).
pub fn decode_stat(buf: &[u8]) -> Result<LoadStat, DecodeError> {
    let mut r = Reader::new(buf);
    let n = match r.next()? {
        Token::Array(n) => n,
        other => {
            return Err(DecodeError::WrongType {
                field: "LoadStat",
                expected: "array",
                got: other.kind(),
            });
        }
    };
    if n < 6 {
        return Err(DecodeError::StatTooShort { got: n });
    }
    match r.next()? {
        Token::Str(t) if t == STAT_TAG.as_bytes() => {}
        Token::Str(t) => {
            return Err(DecodeError::UnknownTag {
                got: String::from_utf8_lossy(t).into_owned(),
            });
        }
        other => {
            return Err(DecodeError::WrongType {
                field: "LoadStat tag",
                expected: "str",
                got: other.kind(),
            });
        }
    }
    let mut s = LoadStat {
        num_running_reqs: int("num_running_reqs", r.next()?)?,
        num_waiting_reqs: int("num_waiting_reqs", r.next()?)?,
        num_tokens: int("num_tokens", r.next()?)?,
        max_total_num_tokens: int("max_total_num_tokens", r.next()?)?,
        attn_dp_rank: match r.next()? {
            Token::Nil => None,
            t => Some(int("attn_dp_rank", t)?),
        },
        ..LoadStat::default()
    };
    s.num_waiting_uncached_tokens = opt_int(&mut r, "num_waiting_uncached_tokens", 6, n)?;
    s.num_total_tokens = opt_int(&mut r, "num_total_tokens", 7, n)?;
    s.max_running_requests = opt_int(&mut r, "max_running_requests", 8, n)?;
    s.total_prefill_uncached_tokens = opt_int(&mut r, "total_prefill_uncached_tokens", 9, n)?;
    s.total_prefill_busy_us = opt_int(&mut r, "total_prefill_busy_us", 10, n)?;
    skip_extra(&mut r, n, STAT_LEN)?;
    finish(&r)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn golden_bytes_from_protocol() {
        assert_eq!(hex(&snapshot_bytes(&LoadSnapshot::default())), "de0000");
        let s = LoadSnapshot {
            dp_rank: 1,
            ..Default::default()
        };
        assert_eq!(
            hex(&snapshot_bytes(&s)),
            format!("de0001a7{}01", hex(b"dp_rank"))
        );
        let s = LoadSnapshot {
            timestamp: Some(1.0),
            dp_rank: 1,
            num_running_reqs: 5,
            ..Default::default()
        };
        let want = format!(
            "de0003a9{}cb3ff0000000000000a7{}01b0{}05",
            hex(b"timestamp"),
            hex(b"dp_rank"),
            hex(b"num_running_reqs")
        );
        assert_eq!(hex(&snapshot_bytes(&s)), want);
        let st = LoadStat {
            num_running_reqs: 1,
            num_waiting_reqs: 2,
            num_tokens: 3,
            max_total_num_tokens: 4,
            attn_dp_rank: Some(0),
            ..Default::default()
        };
        assert_eq!(
            hex(&stat_bytes(&st)),
            "9ba84c6f616453746174010203040000000000 00".replace(' ', "")
        );
    }

    #[test]
    fn explicit_zero_float_is_written_and_negative_zero_kept() {
        let s = LoadSnapshot {
            token_usage: Some(-0.0),
            ..Default::default()
        };
        let b = snapshot_bytes(&s);
        assert!(hex(&b).ends_with("cb8000000000000000"));
        let back = decode_snapshot(&b).unwrap();
        assert_eq!(back.token_usage.unwrap().to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn tolerant_decoding() {
        // fixmap with an unknown key, an int for a float, and an old 4-element queue section.
        let mut b = vec![0x83];
        b.push(0xa0 | 7);
        b.extend_from_slice(b"unknown");
        b.extend_from_slice(&[0x92, 0x01, 0xa1, b'x']);
        b.push(0xa0 | 11);
        b.extend_from_slice(b"token_usage");
        b.push(0x01);
        b.push(0xa0 | 6);
        b.extend_from_slice(b"queues");
        b.extend_from_slice(&[0x94, 1, 2, 3, 4]);
        let s = decode_snapshot(&b).unwrap();
        assert_eq!(s.token_usage, Some(1.0));
        let q = s.queues.unwrap();
        assert_eq!((q.waiting, q.retracted, q.prealloc_ready), (1, 4, 0));
    }

    #[test]
    fn short_and_long_stats() {
        // 6 elements (tag + #34608's five), then 13 elements with two unknown trailing ones.
        let short = [
            0x96, 0xa8, b'L', b'o', b'a', b'd', b'S', b't', b'a', b't', 7, 8, 9, 10, 0xc0,
        ];
        let s = decode_stat(&short).unwrap();
        assert_eq!(
            (s.num_running_reqs, s.max_total_num_tokens, s.attn_dp_rank),
            (7, 10, None)
        );
        let mut long = stat_bytes(&LoadStat {
            total_prefill_busy_us: 99,
            ..Default::default()
        });
        long[0] = 0x9d;
        long.extend_from_slice(&[0x05, 0xa1, b'z']);
        assert_eq!(decode_stat(&long).unwrap().total_prefill_busy_us, 99);
        assert!(matches!(
            decode_stat(&short[..1 + 9 + 3]),
            Err(DecodeError::StatTooShort { .. }) | Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn typed_errors_name_the_field() {
        let mut b = vec![0x81, 0xa0 | 16];
        b.extend_from_slice(b"num_running_reqs");
        b.extend_from_slice(&[0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]);
        let e = decode_snapshot(&b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field `num_running_reqs`: expected int, got float"
        );
        let mut b = vec![0x81, 0xa0 | 7];
        b.extend_from_slice(b"dp_rank");
        b.extend_from_slice(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            decode_snapshot(&b),
            Err(DecodeError::IntOutOfRange {
                field: "dp_rank",
                ..
            })
        ));
        assert!(matches!(
            decode_payload(&[0x05]),
            Err(DecodeError::UnknownPayload { got: "int" })
        ));
        assert!(matches!(
            decode_payload(&[0xde, 0, 0, 0]),
            Err(DecodeError::TrailingBytes { trailing: 1 })
        ));
    }
}
