//! The allocator's share of the router's memory budget. glibc gives each thread that allocates
//! under contention an arena of its own (up to 8 per core), and an arena keeps what it has freed;
//! the router's threads (tokio workers, the blocking pool that parses large polled pages and
//! request bodies, the ingest threads) then each hold on to their own peak. Measured under
//! `loadlink bench soak`: router RSS +50 MiB over idle with glibc's default arenas, +30 MiB with
//! two (`MALLOC_ARENA_MAX=2`), at no cost in throughput the soak could see. The binary calls
//! [`bound_arenas`] at start; `MALLOC_ARENA_MAX` set by the operator wins.

/// Arenas the router allows glibc's allocator.
pub const ROUTER_ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at `n` unless `MALLOC_ARENA_MAX` is set; returns whether it did.
/// A no-op on other allocators and C libraries.
pub fn bound_arenas(n: i32) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; it is called before the router's
        // threads exist.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = n;
        false
    }
}
