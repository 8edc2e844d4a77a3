//! Bounded waits: poll a condition until it holds or a deadline passes, then fail naming what was
//! awaited. Tests wait for a state, never for a fixed time, so they are as fast as the system and
//! still end when it is broken.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// Pause between two polls.
const POLL: Duration = Duration::from_millis(20);

/// Polls `attempt` until it returns `Ok`, for up to `secs` seconds, and returns the value.
/// Panics on timeout with `what` and the last `Err`, which should describe the state seen.
pub async fn wait_until<T, E, F, Fut>(what: &str, secs: u64, mut attempt: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match attempt().await {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {secs} s waiting for {what}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Polls `cond` until it is true, for up to `secs` seconds; panics naming `what` on timeout.
pub async fn wait_for<F, Fut>(what: &str, secs: u64, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until(what, secs, || {
        let fut = cond();
        async move { if fut.await { Ok(()) } else { Err("false") } }
    })
    .await
}

/// The blocking form of [`wait_until`], for threads that own a libzmq socket.
pub fn wait_until_sync<T, E: Display>(
    what: &str,
    secs: u64,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match attempt() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {secs} s waiting for {what}; last seen: {last}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// The blocking form of [`wait_for`].
pub fn wait_for_sync(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    wait_until_sync(what, secs, || if cond() { Ok(()) } else { Err("false") })
}
