//! What each worker serves, as the fleet records it: a refresh's answer replaces the registry's
//! record and feeds the adapter book, and a change rebuilds the roster, so requests see the new
//! candidates at once ([`crate::models`]).

use super::Fleet;
use crate::book::Worker;
use crate::models::ServedModels;
use crate::models::fetch::ModelsError;

impl Fleet {
    /// Records what `url` serves (a refresh's answer); a change rebuilds the roster.
    pub fn set_models(&self, url: &str, answer: Result<ServedModels, ModelsError>) {
        let _commit = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(worker) = self.find(url) else { return };
        refuse_models(&worker, &answer);
        if let Ok(served) = &answer {
            self.adapters.apply_served(url, served, worker.now_ms());
        }
        if self.models.record(url, answer) {
            self.models
                .changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.roster.rcu(|r| self.rebuilt(r.workers.to_vec()));
        }
    }
}

/// Counts a refused model answer as `worker`'s refusal.
pub(super) fn refuse_models(worker: &Worker, answer: &Result<ServedModels, ModelsError>) {
    if let Err(ModelsError {
        refusal: Some(r),
        reason,
    }) = answer
    {
        worker.refusals.refuse(*r, || reason.clone());
    }
}
