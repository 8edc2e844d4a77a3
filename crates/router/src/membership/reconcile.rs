//! Applying a source's wanted set: what the source owns, adds that run concurrently in their own
//! tasks (a stalled worker's discovery holds up nothing else), and removals of only what the
//! source added.

use crate::fleet::discover;
use crate::state::AppState;
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

/// What one source owns: the workers it added, and the adds still discovering.
#[derive(Debug, Default)]
struct Owned {
    /// In the fleet because this source added them.
    added: BTreeSet<String>,
    /// Adds in flight; taking a URL out of this set cancels its add.
    adding: BTreeSet<String>,
}

/// Applies a source's wanted set to the fleet, remembering what that source added. Dropping it
/// (the router stops) cancels the adds in flight.
pub struct Reconciler {
    st: Arc<AppState>,
    owned: Arc<Mutex<Owned>>,
    adds: tokio::task::JoinSet<()>,
    discoveries: Arc<tokio::sync::Semaphore>,
}

impl Reconciler {
    pub fn new(st: Arc<AppState>) -> Self {
        let discoveries = Arc::new(tokio::sync::Semaphore::new(
            st.cfg.discovery_concurrency.max(1),
        ));
        Reconciler {
            st,
            owned: Arc::default(),
            adds: tokio::task::JoinSet::new(),
            discoveries,
        }
    }

    /// Starts adding the wanted workers the fleet lacks (without waiting for them) and removes
    /// the ones this source added and no longer wants; adds of URLs no longer wanted are
    /// cancelled. Workers this source did not add are left alone.
    pub async fn apply(&mut self, wanted: &BTreeSet<String>) {
        while self.adds.try_join_next().is_some() {}
        let present: HashSet<String> = self
            .st
            .fleet
            .workers()
            .iter()
            .map(|w| w.url.clone())
            .collect();
        let (new, gone) = {
            let mut o = self.owned.lock().unwrap_or_else(|p| p.into_inner());
            // Removed by someone else (the admin API): no longer ours; listed again, added again.
            o.added.retain(|u| present.contains(u));
            let gone: Vec<String> = o.added.difference(wanted).cloned().collect();
            for u in &gone {
                o.added.remove(u);
            }
            o.adding.retain(|u| wanted.contains(u));
            let new: Vec<String> = wanted
                .iter()
                .filter(|u| !present.contains(*u) && !o.adding.contains(*u))
                .cloned()
                .collect();
            o.adding.extend(new.iter().cloned());
            (new, gone)
        };
        for url in new {
            self.adds.spawn(add(
                self.st.clone(),
                self.owned.clone(),
                self.discoveries.clone(),
                url,
            ));
        }
        if gone.is_empty() {
            return;
        }
        let st = self.st.clone();
        // Unsubscribing joins the ingest: not on the executor.
        let _ = tokio::task::spawn_blocking(move || {
            for url in gone {
                st.fleet.remove(&url);
                st.membership.removed.fetch_add(1, Relaxed);
                tracing::info!(worker = %url, "membership: removed");
            }
        })
        .await;
    }

    /// The workers this source added and still wants (for tests and diagnostics).
    pub fn owned(&self) -> BTreeSet<String> {
        let o = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        o.added.clone()
    }
}

/// Discovers `url` and adds it, unless the add was cancelled meanwhile or someone else added the
/// URL first (then it is theirs).
async fn add(
    st: Arc<AppState>,
    owned: Arc<Mutex<Owned>>,
    discoveries: Arc<tokio::sync::Semaphore>,
    url: String,
) {
    let Ok(_permit) = discoveries.acquire_owned().await else {
        return;
    };
    let d = discover(&st.client, &url, &st.discovery_limits()).await;
    let mut o = owned.lock().unwrap_or_else(|p| p.into_inner());
    if !o.adding.remove(&url) || st.fleet.contains(&url) {
        return;
    }
    // Under the lock, so a concurrent `apply` sees the worker either adding or added.
    st.fleet.add(&url, d);
    o.added.insert(url.clone());
    st.membership.added.fetch_add(1, Relaxed);
    tracing::info!(worker = %url, "membership: added");
}
