//! Removal of slot files left by engines that died without a shutdown (SIGKILL, a crash, the
//! OOM killer). A slot file lives in `/dev/shm` (memory, 16 KiB per rank) until someone unlinks
//! it; an engine removes its own on every exit it controls, but nothing runs after a SIGKILL. So
//! each engine, at start, removes the loadlink engine slot files whose owning process (the PID in
//! the name, [`loadlink_wire::shm::engine_slot_owner`]) no longer exists.
//!
//! Only files named exactly as a loadlink engine names them are considered; a live owner's file
//! is kept. The check reads `/proc`: where it is not mounted, nothing is removed (every process
//! would look dead). An engine in another PID namespace sharing this `/dev/shm` would look dead
//! too; give such engines their own `/dev/shm` (a container's default).

use loadlink_wire::shm::engine_slot_owner;
use std::path::{Path, PathBuf};

/// The directory slot files live in.
pub const SHM_DIR: &str = "/dev/shm";

/// Removes, from `dir`, the loadlink engine slot files whose owner process is gone; returns the
/// paths removed. Errors (an unreadable directory, a file removed concurrently) are skipped: this
/// is housekeeping, it never stops an engine from starting.
pub fn remove_stale_slot_files(dir: &Path) -> Vec<PathBuf> {
    if !Path::new("/proc/self").exists() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = engine_slot_owner(e.file_name().to_str()?)?;
            (!process_exists(pid)).then(|| e.path())
        })
        .filter(|path| std::fs::remove_file(path).is_ok())
        .collect()
}

/// Whether a process with this PID exists (in this PID namespace).
fn process_exists(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_wire::shm::{engine_instance, shm_path_for};

    fn slot_name(port: u16, pid: u32) -> String {
        let path = shm_path_for(&engine_instance(port, pid));
        path.rsplit('/').next().unwrap().to_string()
    }

    #[test]
    fn removes_only_files_of_engines_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        // A PID that existed and is gone: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let alive = std::process::id();
        let files = [
            slot_name(31000, dead),
            slot_name(31001, alive),
            "sglang_loads_default_0a1b2c3d.shm".to_string(),
        ];
        for f in &files {
            std::fs::write(dir.path().join(f), b"SLNS").unwrap();
        }
        let removed = remove_stale_slot_files(dir.path());
        assert_eq!(removed, vec![dir.path().join(&files[0])]);
        assert!(!dir.path().join(&files[0]).exists());
        assert!(
            dir.path().join(&files[1]).exists(),
            "a live engine's file stays"
        );
        assert!(
            dir.path().join(&files[2]).exists(),
            "not a loadlink engine's file"
        );
    }

    #[test]
    fn a_missing_directory_removes_nothing() {
        assert!(remove_stale_slot_files(Path::new("/no/such/dir")).is_empty());
    }
}
