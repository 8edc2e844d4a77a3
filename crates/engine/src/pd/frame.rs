//! The bootstrap protocol's frames (documented in `docs/protocol.md`, "Bootstrap protocol"):
//! a 4-byte big-endian payload length, then the payload: one kind byte and its fields, all
//! integers big-endian. Decode → prefill: `register`; prefill → decode: `transferred`, `failed`.
//!
//! Decoding never panics: a length over [`MAX_FRAME`], an unknown kind, a wrong size or a
//! reason that is not UTF-8 is an error, and the reader closes that connection.

use tokio::io::{AsyncRead, AsyncReadExt};

/// The largest payload either side accepts (bytes).
pub const MAX_FRAME: usize = 1024;
/// The longest failure reason sent (bytes; longer ones are cut at a character boundary).
pub const MAX_REASON: usize = 512;
/// The protocol version a `register` frame carries.
pub const VERSION: u8 = 1;

const REGISTER: u8 = 1;
const TRANSFERRED: u8 = 2;
const FAILED: u8 = 3;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Decode → prefill: send me room `room`'s KV (`dp_rank`: the prefill rank that holds it,
    /// `-1` when the router named none).
    Register { room: u64, dp_rank: i32 },
    /// Prefill → decode: room `room`'s KV, `tokens` prompt tokens of `bytes` bytes, was sent.
    Transferred { room: u64, tokens: u64, bytes: u64 },
    /// Prefill → decode: room `room`'s KV will not come, and why.
    Failed { room: u64, reason: String },
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame length {0} is outside 1..={MAX_FRAME} bytes")]
    Length(usize),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("frame kind {kind}: expected {expected} payload bytes, got {got}")]
    Size {
        kind: u8,
        expected: usize,
        got: usize,
    },
    #[error("register: protocol version {0}, expected {VERSION}")]
    Version(u8),
    #[error("failed: the reason is not UTF-8")]
    Reason,
    #[error("reading a frame: {0}")]
    Io(String),
}

impl Frame {
    /// The frame on the wire, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(32);
        match self {
            Frame::Register { room, dp_rank } => {
                p.push(REGISTER);
                p.push(VERSION);
                p.extend_from_slice(&room.to_be_bytes());
                p.extend_from_slice(&dp_rank.to_be_bytes());
            }
            Frame::Transferred {
                room,
                tokens,
                bytes,
            } => {
                p.push(TRANSFERRED);
                p.extend_from_slice(&room.to_be_bytes());
                p.extend_from_slice(&tokens.to_be_bytes());
                p.extend_from_slice(&bytes.to_be_bytes());
            }
            Frame::Failed { room, reason } => {
                p.push(FAILED);
                p.extend_from_slice(&room.to_be_bytes());
                p.extend_from_slice(truncate(reason, MAX_REASON).as_bytes());
            }
        }
        let mut out = Vec::with_capacity(4 + p.len());
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(&p);
        out
    }

    /// Parses one payload (without its length prefix).
    pub fn decode(p: &[u8]) -> Result<Frame, FrameError> {
        let (&kind, body) = p.split_first().ok_or(FrameError::Length(0))?;
        let exact = |expected: usize| {
            if body.len() == expected {
                Ok(())
            } else {
                Err(FrameError::Size {
                    kind,
                    expected,
                    got: body.len(),
                })
            }
        };
        let u64_at = |i: usize| u64::from_be_bytes(body[i..i + 8].try_into().unwrap_or([0; 8]));
        match kind {
            REGISTER => {
                exact(13)?;
                if body[0] != VERSION {
                    return Err(FrameError::Version(body[0]));
                }
                let rank = i32::from_be_bytes(body[9..13].try_into().unwrap_or([0; 4]));
                Ok(Frame::Register {
                    room: u64::from_be_bytes(body[1..9].try_into().unwrap_or([0; 8])),
                    dp_rank: rank,
                })
            }
            TRANSFERRED => {
                exact(24)?;
                Ok(Frame::Transferred {
                    room: u64_at(0),
                    tokens: u64_at(8),
                    bytes: u64_at(16),
                })
            }
            FAILED => {
                if body.len() < 8 || body.len() > 8 + MAX_REASON {
                    return Err(FrameError::Size {
                        kind,
                        expected: 8,
                        got: body.len(),
                    });
                }
                let reason = std::str::from_utf8(&body[8..]).map_err(|_| FrameError::Reason)?;
                Ok(Frame::Failed {
                    room: u64_at(0),
                    reason: reason.to_string(),
                })
            }
            k => Err(FrameError::Kind(k)),
        }
    }
}

/// Reads one frame. `Ok(None)`: the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(FrameError::Io(e.to_string())),
    }
    let n = u32::from_be_bytes(len) as usize;
    if n == 0 || n > MAX_FRAME {
        return Err(FrameError::Length(n));
    }
    let mut payload = vec![0u8; n];
    r.read_exact(&mut payload)
        .await
        .map_err(|e| FrameError::Io(e.to_string()))?;
    Frame::decode(&payload).map(Some)
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        for f in [
            Frame::Register {
                room: (1 << 63) - 1,
                dp_rank: -1,
            },
            Frame::Transferred {
                room: 7,
                tokens: 100,
                bytes: 100 << 17,
            },
            Frame::Failed {
                room: 9,
                reason: "prefill engine stopping".into(),
            },
        ] {
            let wire = f.encode();
            assert_eq!(
                wire.len() - 4,
                u32::from_be_bytes(wire[..4].try_into().unwrap()) as usize
            );
            assert_eq!(Frame::decode(&wire[4..]), Ok(f));
        }
    }

    #[test]
    fn malformed_payloads_are_errors() {
        assert_eq!(Frame::decode(&[]), Err(FrameError::Length(0)));
        assert_eq!(Frame::decode(&[9, 0]), Err(FrameError::Kind(9)));
        assert!(matches!(
            Frame::decode(&[2, 0, 0]),
            Err(FrameError::Size { .. })
        ));
        let mut reg = Frame::Register {
            room: 1,
            dp_rank: 0,
        }
        .encode();
        reg[5] = 2; // version
        assert_eq!(Frame::decode(&reg[4..]), Err(FrameError::Version(2)));
        let mut bad = vec![3];
        bad.extend_from_slice(&[0; 8]);
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(Frame::decode(&bad), Err(FrameError::Reason));
        let long = Frame::Failed {
            room: 1,
            reason: "é".repeat(600),
        }
        .encode();
        assert!(
            long.len() - 4 <= 9 + MAX_REASON,
            "reasons are cut to the budget"
        );
        assert!(Frame::decode(&long[4..]).is_ok());
    }

    #[tokio::test]
    async fn over_budget_length_is_refused_before_reading() {
        let mut wire: &[u8] = &[0, 0, 0x10, 0];
        assert_eq!(read_frame(&mut wire).await, Err(FrameError::Length(4096)));
        let mut empty: &[u8] = &[];
        assert_eq!(read_frame(&mut empty).await, Ok(None));
    }
}
