//! The slice of MessagePack that the load protocol uses, written the way msgspec writes it.
//!
//! Why hand-written: compatibility with SGLang is defined by msgspec's exact bytes (map16 header
//! for the snapshot struct, smallest int forms, float64 for every float). A general-purpose
//! msgpack library picks its own forms, so the writer here encodes exactly msgspec's choices,
//! and the reader accepts every form the spec allows (a tolerant decoder), without allocating.

use crate::error::DecodeError;

/// The reader's own small error (kept small so `Result<Token, _>` stays in registers); converted
/// into [`DecodeError`] at the codec boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    Truncated { at: usize },
    ReservedByte { at: usize },
    TooDeep,
}

impl From<ReadError> for DecodeError {
    #[cold]
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Truncated { at } => DecodeError::Truncated { at },
            ReadError::ReservedByte { at } => DecodeError::ReservedByte { at },
            ReadError::TooDeep => DecodeError::TooDeep,
        }
    }
}

/// A fixstr-encoded map key padded to 32 bytes.
pub(crate) type KeyBlock = [u8; 32];

/// Encodes a field name (< 32 bytes) as a fixstr key block at compile time.
pub(crate) const fn key_block(name: &str) -> KeyBlock {
    let b = name.as_bytes();
    assert!(b.len() < 32, "field names are fixstr keys");
    let mut out = [0u8; 32];
    out[0] = 0xa0 | b.len() as u8;
    let mut i = 0;
    while i < b.len() {
        out[i + 1] = b[i];
        i += 1;
    }
    out
}

/// Appends msgspec-shaped MessagePack to a byte buffer.
pub(crate) struct Writer<'a> {
    pub(crate) out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    /// A signed integer in its smallest form (msgspec: unsigned forms for non-negative values).
    pub(crate) fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.out.push(v as i8 as u8);
        } else if v >= i8::MIN as i64 {
            self.out.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i16::MIN as i64 {
            self.out.push(0xd1);
            self.out.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i32::MIN as i64 {
            self.out.push(0xd2);
            self.out.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.out.push(0xd3);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn uint(&mut self, v: u64) {
        if v <= 0x7f {
            self.out.push(v as u8);
        } else if v <= u8::MAX as u64 {
            self.out.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u16::MAX as u64 {
            self.out.push(0xcd);
            self.out.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u32::MAX as u64 {
            self.out.push(0xce);
            self.out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.out.push(0xcf);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// Every float is written as float64, as msgspec does for Python floats.
    #[inline]
    pub(crate) fn float(&mut self, v: f64) {
        let b = v.to_be_bytes();
        self.out
            .extend_from_slice(&[0xcb, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    }

    /// A map key prepared by [`key_block`]: copied as one fixed-size block (inlined, no
    /// `memcpy` call per key), then trimmed to its real length.
    #[inline]
    pub(crate) fn key(&mut self, block: &KeyBlock) {
        let at = self.out.len();
        self.out.extend_from_slice(block);
        self.out.truncate(at + 1 + (block[0] & 0x1f) as usize);
    }

    pub(crate) fn nil(&mut self) {
        self.out.push(0xc0);
    }

    pub(crate) fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.out.push(0xa0 | n as u8);
        } else if n <= u8::MAX as usize {
            self.out.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= u16::MAX as usize {
            self.out.push(0xda);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(0xdb);
            self.out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn map_header(&mut self, n: usize) {
        if n < 16 {
            self.out.push(0x80 | n as u8);
        } else if n <= u16::MAX as usize {
            self.out.push(0xde);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(0xdf);
            self.out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub(crate) fn array_header(&mut self, n: usize) {
        if n < 16 {
            self.out.push(0x90 | n as u8);
        } else if n <= u16::MAX as usize {
            self.out.push(0xdc);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(0xdd);
            self.out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

/// One decoded scalar-or-header token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Token<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    /// Above `i64::MAX` (uint64 form).
    BigUint(u64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext,
}

impl Token<'_> {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Token::Nil => "nil",
            Token::Bool(_) => "bool",
            Token::Int(_) | Token::BigUint(_) => "int",
            Token::Float(_) => "float",
            Token::Str(_) => "str",
            Token::Bin(_) => "bin",
            Token::Array(_) => "array",
            Token::Map(_) => "map",
            Token::Ext => "ext",
        }
    }
}

/// Most nested containers `skip` walks before giving up (hostile input must not exhaust memory).
const MAX_SKIP_ITEMS: usize = 1 << 20;

/// A zero-copy reader over a msgpack buffer.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        if self.buf.len() - self.pos < n {
            return Err(ReadError::Truncated { at: self.pos });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline(always)]
    fn be<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn len_prefixed(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        self.take(n)
    }

    /// Peeks the next marker byte without consuming it.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    #[inline(always)]
    pub(crate) fn next(&mut self) -> Result<Token<'a>, ReadError> {
        let at = self.pos;
        let b = *self.buf.get(self.pos).ok_or(ReadError::Truncated { at })?;
        self.pos += 1;
        Ok(match b {
            0x00..=0x7f => Token::Int(b as i64),
            0x80..=0x8f => Token::Map((b & 0x0f) as usize),
            0x90..=0x9f => Token::Array((b & 0x0f) as usize),
            0xa0..=0xbf => Token::Str(self.len_prefixed((b & 0x1f) as usize)?),
            0xc0 => Token::Nil,
            0xc2 => Token::Bool(false),
            0xc3 => Token::Bool(true),
            0xc4 => {
                let n = self.be::<1>()?[0] as usize;
                Token::Bin(self.len_prefixed(n)?)
            }
            0xc5 => {
                let n = u16::from_be_bytes(self.be()?) as usize;
                Token::Bin(self.len_prefixed(n)?)
            }
            0xc6 => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                Token::Bin(self.len_prefixed(n)?)
            }
            0xc7..=0xc9 => {
                let n = match b {
                    0xc7 => self.be::<1>()?[0] as usize,
                    0xc8 => u16::from_be_bytes(self.be()?) as usize,
                    _ => u32::from_be_bytes(self.be()?) as usize,
                };
                self.take(1 + n)?;
                Token::Ext
            }
            0xca => Token::Float(f32::from_be_bytes(self.be()?) as f64),
            0xcb => Token::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Token::Int(self.be::<1>()?[0] as i64),
            0xcd => Token::Int(u16::from_be_bytes(self.be()?) as i64),
            0xce => Token::Int(u32::from_be_bytes(self.be()?) as i64),
            0xcf => {
                let v = u64::from_be_bytes(self.be()?);
                if v > i64::MAX as u64 {
                    Token::BigUint(v)
                } else {
                    Token::Int(v as i64)
                }
            }
            0xd0 => Token::Int(self.be::<1>()?[0] as i8 as i64),
            0xd1 => Token::Int(i16::from_be_bytes(self.be()?) as i64),
            0xd2 => Token::Int(i32::from_be_bytes(self.be()?) as i64),
            0xd3 => Token::Int(i64::from_be_bytes(self.be()?)),
            0xd4..=0xd8 => {
                let n = 1usize << (b - 0xd4);
                self.take(1 + n)?;
                Token::Ext
            }
            0xd9 => {
                let n = self.be::<1>()?[0] as usize;
                Token::Str(self.len_prefixed(n)?)
            }
            0xda => {
                let n = u16::from_be_bytes(self.be()?) as usize;
                Token::Str(self.len_prefixed(n)?)
            }
            0xdb => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                Token::Str(self.len_prefixed(n)?)
            }
            0xdc => Token::Array(u16::from_be_bytes(self.be()?) as usize),
            0xdd => Token::Array(u32::from_be_bytes(self.be()?) as usize),
            0xde => Token::Map(u16::from_be_bytes(self.be()?) as usize),
            0xdf => Token::Map(u32::from_be_bytes(self.be()?) as usize),
            0xe0..=0xff => Token::Int(b as i8 as i64),
            0xc1 => return Err(ReadError::ReservedByte { at }),
        })
    }

    /// Skips one complete value (containers included) without recursion.
    /// The next map key when it is a string; any other key is skipped together with its value
    /// (it names no field of ours) and gives `None`.
    pub(crate) fn str_key(&mut self) -> Result<Option<&'a [u8]>, ReadError> {
        match self.next()? {
            Token::Str(k) => Ok(Some(k)),
            _ => self.skip().map(|()| None),
        }
    }

    pub(crate) fn skip(&mut self) -> Result<(), ReadError> {
        let mut pending: usize = 1;
        let mut walked: usize = 0;
        while pending > 0 {
            walked += 1;
            if walked > MAX_SKIP_ITEMS {
                return Err(ReadError::TooDeep);
            }
            pending -= 1;
            match self.next()? {
                Token::Array(n) => pending = pending.saturating_add(n),
                Token::Map(n) => pending = pending.saturating_add(n.saturating_mul(2)),
                _ => {}
            }
            // A container cannot hold more items than bytes remain: fail fast on lies.
            if pending > self.remaining() {
                return Err(ReadError::Truncated { at: self.pos });
            }
        }
        Ok(())
    }
}
