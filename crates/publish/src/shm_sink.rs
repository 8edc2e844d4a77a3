//! `ShmSink`: the SLNS v2 slot file read by in-engine consumers (DP dispatcher, `/v1/loads`).
//! Layout and write order come from `loadlink_wire::shm`; this file adds the mapping and the
//! `flock` that makes a reader never see a half-written slot.

use crate::sink::{Encoded, Sink, SinkError, WriteOutcome};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::shm::{Header, write_slot};
use memmap2::MmapMut;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Holds an exclusive or shared `flock` for its lifetime.
pub(crate) struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    pub(crate) fn exclusive(f: &'a File) -> std::io::Result<Self> {
        Self::take(f, libc::LOCK_EX)
    }

    pub(crate) fn shared(f: &'a File) -> std::io::Result<Self> {
        Self::take(f, libc::LOCK_SH)
    }

    fn take(f: &'a File, op: libc::c_int) -> std::io::Result<Self> {
        // SAFETY: flock on a valid open descriptor owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FileLock(f))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: as above; unlocking cannot invalidate memory.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub struct ShmSink {
    path: PathBuf,
    file: File,
    map: Option<MmapMut>,
    header: Header,
    rank: u32,
    interval: u32,
    prev_len: usize,
}

impl ShmSink {
    /// Creates (or joins) the slot file for `dp_size` ranks and claims `rank`'s slot, seeding it
    /// with an empty snapshot for that rank as SGLang's writer does.
    pub fn open(path: &Path, dp_size: u16, rank: u32, interval: u32) -> Result<Self, SinkError> {
        if rank >= dp_size as u32 {
            return Err(SinkError::Config(format!(
                "dp_rank {rank} out of range for dp_size {dp_size}"
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let header = Header::new(dp_size);
        let map = {
            let _lock = FileLock::exclusive(&file)?;
            file.set_len(header.file_size() as u64)?;
            // SAFETY: the file is ours to map; other processes only touch it under flock.
            let mut map = unsafe { MmapMut::map_mut(&file)? };
            map[..loadlink_wire::shm::HEADER_LEN].copy_from_slice(&header.encode());
            let seed = snapshot_bytes(&LoadSnapshot {
                dp_rank: rank as i64,
                ..Default::default()
            });
            write_slot(
                &mut map[header.slot_range(rank)?],
                &seed,
                header.payload_capacity(),
            )?;
            map
        };
        Ok(ShmSink {
            path: path.to_path_buf(),
            file,
            map: Some(map),
            header,
            rank,
            interval: interval.max(1),
            prev_len: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Sink for ShmSink {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn interval(&self) -> u32 {
        self.interval
    }
    fn internal(&self) -> bool {
        true
    }

    fn write(&mut self, snap: Encoded<'_>) -> Result<WriteOutcome, SinkError> {
        if snap.snapshot.dp_rank != self.rank as i64 {
            return Err(SinkError::WrongRank {
                expected: self.rank as i64,
                got: snap.snapshot.dp_rank,
            });
        }
        let range = self.header.slot_range(self.rank)?;
        let map = self.map.as_mut().ok_or(SinkError::Closed)?;
        let _lock = FileLock::exclusive(&self.file)?;
        // The first write after open zero-fills the whole slot (seed and any stale bytes).
        let prev = if self.prev_len == 0 {
            usize::MAX
        } else {
            self.prev_len
        };
        write_slot(&mut map[range], snap.bytes, prev)?;
        self.prev_len = snap.bytes.len();
        Ok(WriteOutcome::Sent)
    }

    fn close(&mut self) {
        self.map = None;
    }
}

/// A reader of the slot file for in-engine consumers (the DP dispatcher, `/v1/loads`): maps the
/// file once and copies each rank's payload out under a shared `flock`.
pub struct ShmReader {
    file: File,
    map: memmap2::Mmap,
    header: Header,
}

impl ShmReader {
    pub fn open(path: &Path) -> Result<Self, SinkError> {
        let file = File::open(path)?;
        let map = {
            let _lock = FileLock::shared(&file)?;
            // SAFETY: read-only map; writers only change bytes under the exclusive lock.
            unsafe { memmap2::Mmap::map(&file)? }
        };
        let header = Header::decode(&map)?;
        Ok(ShmReader { file, map, header })
    }

    pub fn dp_size(&self) -> u16 {
        self.header.dp_size
    }

    /// Every rank's payload (`None` for an empty slot).
    pub fn read_all(&self) -> Result<Vec<Option<Vec<u8>>>, SinkError> {
        let _lock = FileLock::shared(&self.file)?;
        (0..self.header.dp_size as u32)
            .map(|r| {
                Ok(
                    loadlink_wire::shm::read_slot(&self.map[self.header.slot_range(r)?])
                        .map(<[u8]>::to_vec),
                )
            })
            .collect()
    }

    /// Every rank's decoded snapshot (`None` for an empty or undecodable slot).
    pub fn snapshots(&self) -> Result<Vec<Option<LoadSnapshot>>, SinkError> {
        Ok(self
            .read_all()?
            .into_iter()
            .map(|p| p.and_then(|b| loadlink_wire::decode_snapshot(&b).ok()))
            .collect())
    }
}

/// Reads every rank's payload once (see [`ShmReader`]).
pub fn read_slots(path: &Path) -> Result<Vec<Option<Vec<u8>>>, SinkError> {
    ShmReader::open(path)?.read_all()
}
