//! The live run's child processes. loadlink's own engines and routers are stopped with SIGTERM,
//! then SIGKILL once [`OWN_GRACE`] has passed: an engine keeps state outside itself (its slot file
//! in `/dev/shm`, removed only by its own shutdown), so killing it outright would leak the file.
//! An external router is a program we do not know: it runs in a process group of its own (a
//! launcher such as `python -m …` or a shell script may start children), writes its output to a
//! log file (shown when it fails to come up), and is stopped with SIGTERM to the group, then
//! SIGKILL once a bound has passed.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long one of loadlink's own processes has to exit after SIGTERM before SIGKILL. Its drain
/// has nothing left to wait for once the run has stopped sending.
pub(crate) const OWN_GRACE: Duration = Duration::from_secs(5);

/// loadlink child processes, stopped together on drop ([`terminate`]).
pub(super) struct Procs(pub(super) Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        terminate(&mut self.0, OWN_GRACE);
    }
}

/// Sends SIGTERM to every child, waits (polling, so quick exits return quickly) until all have
/// exited or `grace` has passed, then SIGKILLs the rest and reaps them. Blocking: it runs on
/// drop, at the end of a run.
pub(crate) fn terminate(children: &mut [Child], grace: Duration) {
    for c in children.iter() {
        signal_pid(c, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline
        && children
            .iter_mut()
            .any(|c| c.try_wait().ok().flatten().is_none())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in children.iter_mut() {
        if c.try_wait().ok().flatten().is_none() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// Sends `signal` to `child` alone; failure means it is gone already.
fn signal_pid(child: &Child, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) on one positive pid; no memory is involved.
    unsafe {
        libc::kill(pid, signal);
    }
}

pub(super) fn spawn(exe: &Path, args: &[String]) -> Result<Child, String> {
    // stdout/stderr are discarded (not piped): an undrained pipe would stall the child.
    Command::new(exe)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))
}

/// An external process, in its own process group, its output in a log file. Stopped (gracefully,
/// bounded) by [`Logged::stop`]; killed, group and all, if dropped first.
pub(super) struct Logged {
    child: Option<Child>,
    pub(super) log: PathBuf,
}

/// How a [`Logged`] process ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Ended {
    /// It exited on its own or after SIGTERM.
    Exited,
    /// It outlived the grace period and was killed.
    Killed,
}

impl Logged {
    pub(super) fn spawn(argv: &[String], log: PathBuf) -> Result<Self, String> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| "an empty command".to_string())?;
        let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {program}: {e}"))?;
        Ok(Logged {
            child: Some(child),
            log,
        })
    }

    /// Whether the process has exited already (a router that dies at start-up).
    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// SIGTERM to the process group; SIGKILL to the group if the leader is still there after
    /// `grace`. Polls, so a quick exit returns quickly.
    pub(super) async fn stop(mut self, grace: Duration) -> Ended {
        let Some(mut child) = self.child.take() else {
            return Ended::Exited;
        };
        signal_group(&child, libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                // The leader is gone; anything it left in the group goes too.
                signal_group(&child, libc::SIGKILL);
                return Ended::Exited;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        signal_group(&child, libc::SIGKILL);
        let _ = child.wait();
        Ended::Killed
    }

    /// The last `lines` lines of the log, for an error message.
    pub(super) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(&child, libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// Sends `signal` to the group `child` leads (it was spawned with `process_group(0)`, so the
/// group id is its pid). Failure means the group is gone already.
fn signal_group(child: &Child, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is involved.
    unsafe {
        libc::kill(-pid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, log: &Path) -> Logged {
        let argv = ["sh", "-c", script].map(String::from);
        Logged::spawn(&argv, log.to_path_buf()).unwrap()
    }

    #[tokio::test]
    async fn sigterm_stops_a_polite_process_and_sigkill_a_stubborn_one() {
        let dir = tempfile::tempdir().unwrap();
        let polite = sh("echo up; exec sleep 30", &dir.path().join("polite.log"));
        // Wait (bounded) until it has written, so the log is known to be captured.
        let deadline = Instant::now() + Duration::from_secs(10);
        while polite.log_tail(1) != "up" && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(polite.log_tail(5), "up");
        assert_eq!(polite.stop(Duration::from_secs(10)).await, Ended::Exited);

        let stubborn = sh(
            "trap '' TERM; echo ready; while :; do sleep 1; done",
            &dir.path().join("stubborn.log"),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while stubborn.log_tail(1) != "ready" && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            stubborn.stop(Duration::from_millis(300)).await,
            Ended::Killed
        );
    }

    #[test]
    fn own_processes_get_sigterm_and_a_stubborn_one_sigkill_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| dir.path().join(name).display().to_string();
        let shell = |script: String| {
            std::process::Command::new("sh")
                .args(["-c", &script])
                .spawn()
                .unwrap()
        };
        let polite = shell(format!(
            "trap 'touch {}; exit 0' TERM; touch {}; while :; do sleep 0.05; done",
            file("terminated"),
            file("polite-ready")
        ));
        let stubborn = shell(format!(
            "trap '' TERM; touch {}; while :; do sleep 0.05; done",
            file("stubborn-ready")
        ));
        // Each shell has set its trap once its ready file exists (bounded wait).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(dir.path().join("polite-ready").exists()
            && dir.path().join("stubborn-ready").exists())
        {
            assert!(Instant::now() < deadline, "the shells did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut children = vec![polite, stubborn];
        terminate(&mut children, Duration::from_millis(500));
        assert!(
            dir.path().join("terminated").exists(),
            "the polite child ran its SIGTERM handler"
        );
        let codes: Vec<_> = children.iter_mut().map(|c| c.try_wait().unwrap()).collect();
        assert!(
            codes.iter().all(Option::is_some),
            "both are reaped: {codes:?}"
        );
    }

    #[test]
    fn a_missing_program_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let argv = ["/no/such/program".to_string()];
        assert!(Logged::spawn(&argv, dir.path().join("x.log")).is_err());
        assert!(Logged::spawn(&[], dir.path().join("y.log")).is_err());
    }
}
