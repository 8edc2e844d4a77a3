//! The three-frame message shared by both generations and by SGLang's KV-event stream:
//! `[topic, big-endian i64 seq, msgpack payload]`. Anything else is rejected with a typed reason
//! so subscribers can count drops per cause. Sequence −1 is the reserved end marker.

use crate::codec::{Payload, decode_payload};
use crate::error::FrameError;

/// Generation A's topic (empty: subscribe-all).
pub const SNAPSHOT_TOPIC: &[u8] = b"";
/// Generation B's topic.
pub const LOAD_TOPIC: &[u8] = b"load";
/// The reserved end-marker sequence number.
pub const END_MARKER_SEQ: i64 = -1;

/// The sequence frame for `seq`.
pub fn seq_frame(seq: i64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// A checked message whose payload is still raw bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawMessage<'a> {
    pub topic: &'a [u8],
    pub seq: i64,
    pub payload: &'a [u8],
}

/// A checked and decoded message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub seq: i64,
    pub payload: Payload,
}

/// Checks frame count, sequence length and the end marker; does not decode the payload.
pub fn split_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<RawMessage<'_>, FrameError> {
    let [topic, seq, payload] = frames else {
        return Err(FrameError::FrameCount(frames.len()));
    };
    let seq: [u8; 8] = seq
        .as_ref()
        .try_into()
        .map_err(|_| FrameError::SeqLength(seq.as_ref().len()))?;
    let seq = i64::from_be_bytes(seq);
    if seq == END_MARKER_SEQ {
        return Err(FrameError::EndMarker);
    }
    Ok(RawMessage {
        topic: topic.as_ref(),
        seq,
        payload: payload.as_ref(),
    })
}

/// Checks the frames and decodes the payload of either generation.
pub fn decode_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message, FrameError> {
    let raw = split_frames(frames)?;
    Ok(Message {
        seq: raw.seq,
        payload: decode_payload(raw.payload)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::snapshot_bytes;
    use crate::snapshot::LoadSnapshot;

    #[test]
    fn rejects_each_malformation_by_reason() {
        let p = snapshot_bytes(&LoadSnapshot::default());
        let ok: [&[u8]; 3] = [b"", &seq_frame(7), &p];
        assert_eq!(decode_frames(&ok).unwrap().seq, 7);
        let two: [&[u8]; 2] = [b"", &p];
        assert_eq!(decode_frames(&two).unwrap_err().reason(), "frame_count");
        let short: [&[u8]; 3] = [b"", &[0; 7], &p];
        assert_eq!(decode_frames(&short).unwrap_err(), FrameError::SeqLength(7));
        let end: [&[u8]; 3] = [b"", &[0xff; 8], &p];
        assert_eq!(decode_frames(&end).unwrap_err(), FrameError::EndMarker);
        let bad: [&[u8]; 3] = [b"", &seq_frame(1), &[0xc1]];
        assert_eq!(decode_frames(&bad).unwrap_err().reason(), "payload");
    }
}
