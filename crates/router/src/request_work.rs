//! Request-path CPU work (body parse, tokenization, block hashing: a cache lookup) off the async
//! executor, on a bounded pool.
//!
//! A 16 MiB body takes far longer to parse, tokenize and hash than a tokio worker may be held:
//! run inline, a few of them stall every other request, the load-stream bookkeeping timers and
//! `/metrics`. So a body larger than [`Budgets::request_work_inline_bytes`] is worked on tokio's
//! blocking threads, at most [`Budgets::request_work_threads`] at a time (one per core by
//! default), with at most [`Budgets::request_work_queue`] more waiting for a thread. Beyond that
//! the router is out of CPU for requests: [`RequestWork::run`] answers [`WorkError::Busy`] at
//! once (the proxy's 503, counted as `request_too_large`), rather than queueing without bound.
//! Small bodies stay inline: their work costs less than the hop to another thread.
//!
//! The counts are guards: a job's place is released when the job ends, even when the client that
//! asked for it has gone (the job still runs to its end, so the thread budget holds).

use crate::budget::Budgets;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;
use tokio::sync::Semaphore;

/// Why request work did not run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkError {
    /// Every thread is busy and the queue of waiting work is full.
    #[error(
        "the router's request-work pool is full ({threads} threads busy, {queue} requests waiting: --request-work-threads, --request-work-queue); retry later"
    )]
    Busy { threads: usize, queue: usize },
    /// The work panicked or was cancelled (a bug, not the client's input).
    #[error("request work failed: {0}")]
    Failed(String),
}

/// The pool's budget and counters.
#[derive(Debug)]
pub struct RequestWork {
    threads: usize,
    queue: usize,
    inline_bytes: usize,
    permits: Arc<Semaphore>,
    /// Jobs admitted: running, or waiting for a thread.
    admitted: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    /// When a refusal was last logged (ms since `epoch`; `u64::MAX`: never).
    logged_ms: AtomicU64,
    epoch: Instant,
}

/// A repeating refusal is logged at most this often.
const LOG_EVERY_MS: u64 = 10_000;

impl Default for RequestWork {
    fn default() -> Self {
        RequestWork::new(&Budgets::default())
    }
}

/// One admitted job's place; dropped when the job ends (or never starts).
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl RequestWork {
    /// The pool of `budgets`; 0 threads means one per core.
    pub fn new(budgets: &Budgets) -> Self {
        let threads = match budgets.request_work_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        RequestWork {
            threads,
            queue: budgets.request_work_queue,
            inline_bytes: budgets.request_work_inline_bytes,
            permits: Arc::new(Semaphore::new(threads)),
            admitted: Arc::default(),
            running: Arc::default(),
            logged_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }
    }

    /// Whether work on a body of `bytes` is cheaper inline than on the pool.
    pub fn inline(&self, bytes: usize) -> bool {
        bytes <= self.inline_bytes
    }

    /// Jobs running on the pool now.
    pub fn running(&self) -> usize {
        self.running.load(Relaxed)
    }

    /// Jobs waiting for a thread now.
    pub fn waiting(&self) -> usize {
        self.admitted.load(Relaxed).saturating_sub(self.running())
    }

    /// Whether a refusal should be logged now: the first one, then at most once per
    /// [`LOG_EVERY_MS`] (the rest are counted, not logged).
    pub fn note_refusal(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.logged_ms.load(Relaxed);
        if last != u64::MAX && now < last.saturating_add(LOG_EVERY_MS) {
            return false;
        }
        self.logged_ms
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_ok()
    }

    /// Runs `work` on the pool, or refuses it at once when the pool and its queue are full.
    pub async fn run<T, F>(&self, work: F) -> Result<T, WorkError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let limit = self.threads + self.queue;
        if self.admitted.fetch_add(1, Relaxed) >= limit {
            self.admitted.fetch_sub(1, Relaxed);
            return Err(WorkError::Busy {
                threads: self.threads,
                queue: self.queue,
            });
        }
        let place = Place(self.admitted.clone());
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| WorkError::Failed(e.to_string()))?;
        let running = self.running.clone();
        let job = tokio::task::spawn_blocking(move || {
            running.fetch_add(1, Relaxed);
            let _running = Place(running);
            let _held = (place, permit);
            work()
        });
        job.await.map_err(|e| WorkError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn pool(threads: usize, queue: usize) -> RequestWork {
        RequestWork::new(&Budgets {
            request_work_threads: threads,
            request_work_queue: queue,
            ..Default::default()
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn work_runs_off_the_executor_and_beyond_the_budget_is_refused() {
        let work = Arc::new(pool(1, 1));
        let (release, wait) = mpsc::channel::<()>();
        let wait = Arc::new(std::sync::Mutex::new(wait));
        let blocked = |w: &Arc<RequestWork>| {
            let (w, wait) = (w.clone(), wait.clone());
            tokio::spawn(async move {
                w.run(move || {
                    let _ = wait.lock().unwrap().recv();
                })
                .await
            })
        };
        let first = blocked(&work);
        let second = blocked(&work);
        // The first blocks its thread; this current-thread executor still runs this test.
        for _ in 0..10_000 {
            if work.running() == 1 && work.waiting() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(
            work.run(|| ()).await,
            Err(WorkError::Busy {
                threads: 1,
                queue: 1
            })
        );
        release.send(()).unwrap();
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(second.await.unwrap(), Ok(()));
        assert_eq!((work.running(), work.waiting()), (0, 0));
        assert_eq!(work.run(|| 7).await, Ok(7));
        assert!(work.inline(1024) && !work.inline(1 << 20));
        assert!(
            work.note_refusal() && !work.note_refusal(),
            "then throttled"
        );
    }
}
