//! The fleet's record of what each worker serves (one owner: the fleet's model table is built from
//! it with the roster). A worker's answer replaces the last one when it is an answer; a failed
//! re-read keeps what the worker last said (a worker that restarts must not lose its models for the
//! seconds it is away) and shows the failure in `/workers`.

use super::fetch::ModelsError;
use super::served::ServedModels;
use super::table::{ModelStats, ModelTable};
use crate::book::Worker;
use crate::candidate::CandidateList;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct Records {
    served: HashMap<String, Arc<ServedModels>>,
    /// The last failure to read a worker's models, while it lasts.
    errors: HashMap<String, String>,
    stats: HashMap<Arc<str>, Arc<ModelStats>>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Registry {
    records: Mutex<Records>,
    /// Re-reads of every worker's models, and the changes they found.
    pub refreshes: AtomicU64,
    pub changes: AtomicU64,
    pub errors: AtomicU64,
    /// Requests refused: a model no worker serves (404), no model named among several (400).
    pub not_found: AtomicU64,
    pub no_default: AtomicU64,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what `url` answered; whether what it serves changed.
    pub fn record(&self, url: &str, answer: Result<ServedModels, ModelsError>) -> bool {
        let mut r = self.lock();
        match answer {
            Ok(s) => {
                r.errors.remove(url);
                let changed = r.served.get(url).is_none_or(|old| **old != s);
                if changed {
                    r.served.insert(url.to_string(), Arc::new(s));
                }
                changed
            }
            Err(e) => {
                self.errors.fetch_add(1, Relaxed);
                r.errors.insert(url.to_string(), e.reason);
                false
            }
        }
    }

    /// Forgets a worker that left the fleet.
    pub fn forget(&self, url: &str) {
        let mut r = self.lock();
        r.served.remove(url);
        r.errors.remove(url);
    }

    /// What `url` serves as last read, and why the last read failed (if it did).
    pub fn of(&self, url: &str) -> (Option<Arc<ServedModels>>, Option<String>) {
        let r = self.lock();
        (r.served.get(url).cloned(), r.errors.get(url).cloned())
    }

    /// The model table of `workers` over their candidate list.
    pub fn table(&self, workers: &[Arc<Worker>], candidates: &CandidateList) -> ModelTable {
        let mut r = self.lock();
        let Records { served, stats, .. } = &mut *r;
        ModelTable::build(workers, candidates, served, stats)
    }

    /// The table of one side of a PD fleet (a subset of the workers [`Registry::table`] was last
    /// built over): its models count into the fleet's counters, and the fleet's list of counters
    /// is left as the whole fleet's table made it.
    pub fn side_table(&self, workers: &[Arc<Worker>], candidates: &CandidateList) -> ModelTable {
        let r = self.lock();
        let mut shared = r.stats.clone();
        ModelTable::build(workers, candidates, &r.served, &mut shared)
    }
}
