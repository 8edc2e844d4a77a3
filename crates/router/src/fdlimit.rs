//! File-descriptor arithmetic for a fleet, and raising the process's soft `RLIMIT_NOFILE` to it.
//!
//! Each load subscription is a libzmq SUB socket: its mailbox's signaler (a socketpair, two
//! descriptors, in the libzmq this links; an eventfd, one, in builds that have it) and one TCP
//! connection, so three descriptors per rank (measured: 2,511 for 800 ranks). On top: one pooled HTTP connection per worker, and a
//! fixed reserve for listeners, clients, libzmq's I/O threads and the runtime. An operator reads
//! the same arithmetic in `docs/router.md`.
//!
//! A rank that also publishes KV events costs another SUB (three more descriptors) and, while a
//! replay runs, a DEALER (three more): [`FDS_PER_KV_RANK`] budgets both, so a fleet-wide resync
//! (every stream replaying at once, e.g. when the router starts) still fits.
//!
//! The arithmetic is applied at start for the discovered fleet and again by the fleet for every
//! worker added later ([`crate::fleet`]), so the soft limit follows the fleet up to the hard limit
//! and [`FD_RESERVE`] stays free for the HTTP listener's `accept()`; a worker beyond the hard
//! limit is refused, not half-subscribed.

/// Descriptors kept for everything that is not per worker.
pub const FD_RESERVE: u64 = 1024;

/// Descriptors per rank subscription.
pub const FDS_PER_RANK: u64 = 3;

/// Descriptors per KV-event rank: its SUB, and its replay DEALER while a replay runs.
pub const FDS_PER_KV_RANK: u64 = 2 * FDS_PER_RANK;

/// Descriptors a fleet of `workers` workers with `ranks` load subscriptions in all needs.
pub fn descriptors_needed(workers: usize, ranks: usize) -> u64 {
    FDS_PER_RANK * ranks as u64 + workers as u64 + FD_RESERVE
}

/// [`descriptors_needed`] plus `kv_ranks` KV-event streams.
pub fn descriptors_needed_with_kv(workers: usize, ranks: usize, kv_ranks: usize) -> u64 {
    descriptors_needed(workers, ranks) + FDS_PER_KV_RANK * kv_ranks as u64
}

/// Why the router cannot hold its fleet's sockets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the fleet needs {needed} file descriptors ({FDS_PER_RANK} per rank subscription + {FDS_PER_KV_RANK} per KV-event rank + 1 per worker + {FD_RESERVE}) but the hard limit is {hard} and this process may not raise it; raise it (ulimit -Hn, systemd LimitNOFILE=, or the container's nofile ulimit) to at least {needed}"
)]
pub struct FdLimitError {
    pub needed: u64,
    pub hard: u64,
}

/// The soft and hard `RLIMIT_NOFILE`.
pub fn current() -> std::io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r.rlim_cur, r.rlim_max))
}

/// Raises the soft limit to `needed` if it is lower (and the hard limit too when it is lower and
/// the process is privileged to); fails with the figure otherwise. Returns the soft limit in force.
pub fn ensure(needed: u64) -> Result<u64, FdLimitError> {
    let (soft, hard) = current().map_err(|_| FdLimitError { needed, hard: 0 })?;
    if soft >= needed {
        return Ok(soft);
    }
    let r = libc::rlimit {
        rlim_cur: needed,
        rlim_max: hard.max(needed),
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(FdLimitError { needed, hard });
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_refusal() {
        assert_eq!(descriptors_needed(1000, 8000), 24_000 + 1000 + FD_RESERVE);
        assert_eq!(
            descriptors_needed_with_kv(1000, 8000, 8000),
            24_000 + 48_000 + 1000 + FD_RESERVE
        );
        let (_, hard) = current().unwrap();
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        // Beyond fs.nr_open not even a privileged process may go.
        if nr_open < u64::MAX / 2 {
            let hard = hard.max(nr_open);
            let e = ensure(hard + 1).unwrap_err();
            assert_eq!(e.needed, hard + 1);
            assert!(e.to_string().contains(&format!("needs {}", hard + 1)));
        }
        let (soft, _) = current().unwrap();
        assert_eq!(ensure(soft).unwrap(), soft, "already enough: unchanged");
    }
}
