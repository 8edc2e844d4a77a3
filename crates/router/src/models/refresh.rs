//! Re-reads every worker's models every `--model-refresh-interval`, so a worker restarted with
//! another model (same URL) is re-registered, and adapters added or loaded show up. Workers are
//! asked concurrently (at most [`CONCURRENCY`] at once), each request bounded by the fan-out
//! budget (`--fanout-timeout-ms`, `--fanout-max-body-bytes`); a change rebuilds the roster at once.

use super::fetch::served_models;
use crate::peer_http::FetchBudget;
use crate::state::AppState;
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Workers asked at once.
pub const CONCURRENCY: usize = 16;

/// Starts the refresh task (`None` when the interval is 0: off).
pub fn spawn(st: &Arc<AppState>) -> Option<tokio::task::JoinHandle<()>> {
    let every = Duration::from_millis(st.cfg.model_refresh_ms);
    if every.is_zero() {
        return None;
    }
    let st = st.clone();
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if st.stopping.load(Relaxed) {
                return;
            }
            refresh_all(&st).await;
        }
    }))
}

/// Re-reads every current worker's models once.
pub async fn refresh_all(st: &AppState) {
    let budget = FetchBudget {
        timeout: st.cfg.budgets.fanout_timeout,
        max_body: st.cfg.budgets.fanout_body_bytes,
    };
    let urls: Vec<String> = st.fleet.workers().iter().map(|w| w.url.clone()).collect();
    let asks = urls.into_iter().map(|url| async move {
        let answer = served_models(&st.client, &url, None, budget).await;
        (url, answer)
    });
    let mut answers = futures_util::stream::iter(asks).buffer_unordered(CONCURRENCY);
    while let Some((url, answer)) = answers.next().await {
        st.fleet.set_models(&url, answer);
    }
    st.fleet.models.refreshes.fetch_add(1, Relaxed);
}
