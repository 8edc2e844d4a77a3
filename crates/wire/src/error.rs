//! Typed errors for everything the wire crate parses. Each names the field or frame at fault and
//! what was expected, so a router can count drops by reason and an operator can act on a log line.

use thiserror::Error;

/// Why a msgpack payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DecodeError {
    #[error("payload truncated at byte {at}")]
    Truncated { at: usize },
    #[error("reserved msgpack byte 0xc1 at byte {at}")]
    ReservedByte { at: usize },
    #[error("payload nests too many values to skip")]
    TooDeep,
    #[error("field `{field}`: expected {expected}, got {got}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
        got: &'static str,
    },
    #[error("field `{field}`: value {value} does not fit a signed 64-bit int")]
    IntOutOfRange { field: &'static str, value: u64 },
    #[error("section `{section}`: expected an array of {min} to {max} elements, got {got}")]
    SectionLength {
        section: &'static str,
        min: usize,
        max: usize,
        got: usize,
    },
    #[error("LoadStat: expected at least 6 elements (tag + 5 fields), got {got}")]
    StatTooShort { got: usize },
    #[error(
        "payload is neither a LoadSnapshot map nor a tagged LoadStat array (starts with {got})"
    )]
    UnknownPayload { got: &'static str },
    #[error("array tag: expected \"LoadStat\", got {got:?}")]
    UnknownTag { got: String },
    #[error("event `type`: expected BlockStored, BlockRemoved or AllBlocksCleared, got {got:?}")]
    UnknownEventType { got: String },
    #[error("{trailing} trailing bytes after the payload")]
    TrailingBytes { trailing: usize },
}

/// Why a three-frame message was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FrameError {
    #[error("expected 3 frames [topic, seq, payload], got {0}")]
    FrameCount(usize),
    #[error("sequence frame: expected exactly 8 bytes (big-endian i64), got {0}")]
    SeqLength(usize),
    #[error("sequence -1 is the reserved end marker, not a load message")]
    EndMarker,
    #[error("payload: {0}")]
    Payload(#[from] DecodeError),
}

impl FrameError {
    /// Every [`FrameError::reason`] label, at its [`FrameError::index`]: counters of dropped
    /// frames are arrays indexed by it, and metrics label them from it.
    pub const REASONS: [&'static str; 4] = ["frame_count", "seq_length", "end_marker", "payload"];

    /// This error's position in [`FrameError::REASONS`].
    pub fn index(&self) -> usize {
        match self {
            FrameError::FrameCount(_) => 0,
            FrameError::SeqLength(_) => 1,
            FrameError::EndMarker => 2,
            FrameError::Payload(_) => 3,
        }
    }

    /// A short stable label for metrics (`reason="..."`).
    pub fn reason(&self) -> &'static str {
        Self::REASONS[self.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_listed_once_at_its_index() {
        let all = [
            FrameError::FrameCount(2),
            FrameError::SeqLength(7),
            FrameError::EndMarker,
            FrameError::Payload(DecodeError::TooDeep),
        ];
        let labels: Vec<&str> = all.iter().map(FrameError::reason).collect();
        assert_eq!(labels, FrameError::REASONS);
        for (i, e) in all.iter().enumerate() {
            assert_eq!(e.index(), i);
        }
    }
}
