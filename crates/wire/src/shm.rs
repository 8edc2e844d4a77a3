//! The SLNS v2 slot-file layout shared with SGLang's in-engine load readers, as pure functions.
//!
//! File: 12-byte little-endian header `"SLNS"`, u16 version 2, u16 dp_size, u32 slot_size; then one
//! slot per rank at `12 + rank * slot_size`: u32 LE payload length, payload, zero fill. A writer
//! stores length 0 first and the real length last (under an exclusive `flock`, which is the
//! caller's job), so a reader that sees length 0 or an impossible length treats the slot as empty.

use blake2::Blake2sVar;
use blake2::digest::{Update, VariableOutput};
use thiserror::Error;

pub const MAGIC: [u8; 4] = *b"SLNS";
pub const VERSION: u16 = 2;
pub const HEADER_LEN: usize = 12;
pub const SLOT_SIZE: u32 = 16 * 1024;
const LEN_PREFIX: usize = 4;

/// The file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub dp_size: u16,
    pub slot_size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShmError {
    #[error("slot file shorter than its {HEADER_LEN}-byte header ({0} bytes)")]
    ShortHeader(usize),
    #[error("slot file magic: expected \"SLNS\", got {0:?}")]
    Magic([u8; 4]),
    #[error("slot file version: expected {VERSION}, got {0}")]
    Version(u16),
    #[error("slot file: slot_size {0} is smaller than the 4-byte length prefix")]
    SlotSize(u32),
    #[error("slot file: {len} bytes cannot hold {dp_size} slots of {slot_size} bytes")]
    TooShort {
        len: usize,
        dp_size: u16,
        slot_size: u32,
    },
    #[error("dp_rank {rank} out of range for dp_size {dp_size}")]
    Rank { rank: u32, dp_size: u16 },
    #[error("payload of {len} bytes exceeds the slot payload capacity {capacity}")]
    PayloadTooLarge { len: usize, capacity: usize },
}

impl Header {
    pub fn new(dp_size: u16) -> Self {
        Header {
            dp_size,
            slot_size: SLOT_SIZE,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6..8].copy_from_slice(&self.dp_size.to_le_bytes());
        h[8..12].copy_from_slice(&self.slot_size.to_le_bytes());
        h
    }

    /// Parses and validates a header against the file length.
    pub fn decode(file: &[u8]) -> Result<Self, ShmError> {
        let h: &[u8; HEADER_LEN] = file
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(ShmError::ShortHeader(file.len()))?;
        let magic: [u8; 4] = h[..4].try_into().unwrap_or_default();
        if magic != MAGIC {
            return Err(ShmError::Magic(magic));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != VERSION {
            return Err(ShmError::Version(version));
        }
        let header = Header {
            dp_size: u16::from_le_bytes([h[6], h[7]]),
            slot_size: u32::from_le_bytes([h[8], h[9], h[10], h[11]]),
        };
        if (header.slot_size as usize) < LEN_PREFIX {
            return Err(ShmError::SlotSize(header.slot_size));
        }
        if file.len() < header.file_size() {
            return Err(ShmError::TooShort {
                len: file.len(),
                dp_size: header.dp_size,
                slot_size: header.slot_size,
            });
        }
        Ok(header)
    }

    pub fn file_size(&self) -> usize {
        HEADER_LEN + self.dp_size as usize * self.slot_size as usize
    }

    /// Byte range of rank's slot within the file.
    pub fn slot_range(&self, rank: u32) -> Result<std::ops::Range<usize>, ShmError> {
        if rank >= self.dp_size as u32 {
            return Err(ShmError::Rank {
                rank,
                dp_size: self.dp_size,
            });
        }
        let start = HEADER_LEN + rank as usize * self.slot_size as usize;
        Ok(start..start + self.slot_size as usize)
    }

    pub fn payload_capacity(&self) -> usize {
        self.slot_size as usize - LEN_PREFIX
    }
}

/// The payload in a slot, or `None` for "no data" (length 0 or impossible).
pub fn read_slot(slot: &[u8]) -> Option<&[u8]> {
    let len = u32::from_le_bytes(slot.get(..LEN_PREFIX)?.try_into().ok()?) as usize;
    if len == 0 || len > slot.len() - LEN_PREFIX {
        return None;
    }
    Some(&slot[LEN_PREFIX..LEN_PREFIX + len])
}

/// Writes `payload` into `slot` in the crash-safe order: length 0, payload, zero fill of the bytes
/// the previous payload used (`prev_len`; pass `slot.len()` when unknown), real length.
pub fn write_slot(slot: &mut [u8], payload: &[u8], prev_len: usize) -> Result<(), ShmError> {
    let capacity = slot.len().saturating_sub(LEN_PREFIX);
    if payload.len() > capacity || payload.is_empty() {
        return Err(ShmError::PayloadTooLarge {
            len: payload.len(),
            capacity,
        });
    }
    slot[..LEN_PREFIX].copy_from_slice(&0u32.to_le_bytes());
    let body = &mut slot[LEN_PREFIX..];
    body[..payload.len()].copy_from_slice(payload);
    let dirty_end = prev_len.min(capacity).max(payload.len());
    body[payload.len()..dirty_end].fill(0);
    slot[..LEN_PREFIX].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    Ok(())
}

/// The slot-file path SGLang derives from an instance id (`ipc_name`):
/// `/dev/shm/sglang_loads_{safe_name}_{blake2s-32 hex}.shm`.
pub fn shm_path_for(instance_id: &str) -> String {
    let trimmed = instance_id.trim_end_matches('/');
    let name = trimmed
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut h = Blake2sVar::new(4).expect("4 is a valid blake2s output size");
    h.update(instance_id.as_bytes());
    let mut digest = [0u8; 4];
    h.finalize_variable(&mut digest)
        .expect("buffer matches the output size");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("/dev/shm/sglang_loads_{safe}_{hex}.shm")
}

/// The instance id a loadlink engine names its slot file after: `loadlink-engine-{port}-{pid}`.
/// The PID in it lets a later engine tell a file whose owner is gone (SIGKILLed) from a live one.
pub fn engine_instance(port: u16, pid: u32) -> String {
    format!("{ENGINE_INSTANCE_PREFIX}{port}-{pid}")
}

const ENGINE_INSTANCE_PREFIX: &str = "loadlink-engine-";

/// The PID of the loadlink engine whose slot file is named `file_name` (a name, not a path), or
/// `None` when the name is not exactly what [`shm_path_for`]`(`[`engine_instance`]`(..))` gives:
/// files of other programs (SGLang's own included) are never claimed.
pub fn engine_slot_owner(file_name: &str) -> Option<u32> {
    let rest = file_name
        .strip_prefix("sglang_loads_")?
        .strip_prefix(ENGINE_INSTANCE_PREFIX)?
        .strip_suffix(".shm")?;
    let (instance, _hash) = rest.rsplit_once('_')?;
    let (port, pid) = instance.split_once('-')?;
    let (port, pid) = (port.parse::<u16>().ok()?, pid.parse::<u32>().ok()?);
    let expected = shm_path_for(&engine_instance(port, pid));
    (expected.rsplit('/').next() == Some(file_name)).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_slots_round_trip() {
        let h = Header::new(3);
        let mut file = vec![0u8; h.file_size()];
        file[..HEADER_LEN].copy_from_slice(&h.encode());
        assert_eq!(Header::decode(&file).unwrap(), h);
        let r = h.slot_range(2).unwrap();
        assert_eq!(r.start, 12 + 2 * 16384);
        assert_eq!(read_slot(&file[r.clone()]), None);
        write_slot(&mut file[r.clone()], b"abcdef", 0).unwrap();
        write_slot(&mut file[r.clone()], b"xy", 6).unwrap();
        assert_eq!(read_slot(&file[r.clone()]), Some(&b"xy"[..]));
        assert!(
            file[r.start + 6..r.start + 10].iter().all(|&b| b == 0),
            "old bytes zero-filled"
        );
        assert!(h.slot_range(3).is_err());
        assert!(write_slot(&mut file[r], &vec![1; 16381], 0).is_err());
        file[4] = 9;
        assert_eq!(Header::decode(&file), Err(ShmError::Version(9)));
        assert!(matches!(
            Header::decode(&file[..5]),
            Err(ShmError::ShortHeader(5))
        ));
    }

    #[test]
    fn an_engine_slot_file_names_its_owner() {
        let path = shm_path_for(&engine_instance(30000, 4242));
        let name = path.rsplit('/').next().unwrap();
        assert_eq!(engine_slot_owner(name), Some(4242));
        // A wrong hash, another program's file, or a stray suffix is not an engine's file.
        let forged = name
            .replace(".shm", "")
            .rsplit_once('_')
            .unwrap()
            .0
            .to_string()
            + "_00000000.shm";
        assert_ne!(forged, name);
        assert_eq!(engine_slot_owner(&forged), None);
        assert_eq!(engine_slot_owner("sglang_loads_default_0a1b2c3d.shm"), None);
        assert_eq!(engine_slot_owner(&format!("{name}.bak")), None);
    }

    #[test]
    fn impossible_length_is_no_data() {
        let mut slot = vec![0u8; 64];
        slot[..4].copy_from_slice(&61u32.to_le_bytes());
        assert_eq!(read_slot(&slot), None);
    }
}
