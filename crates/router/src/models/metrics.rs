//! The models' part of `/metrics`: requests and available workers per model, and what the registry
//! refused. Labels are the models the workers name (at most [`super::served::MAX_NAMES`] per
//! worker, primary names only), so the label set is bounded by the fleet, never by clients: a
//! request for an unknown model is counted in one unlabelled series.

use crate::state::AppState;
use loadlink_wire::prom::{Exposition, MetricType};
use std::sync::atomic::Ordering::Relaxed;

pub fn write(e: &mut Exposition, st: &AppState) {
    let roster = st.fleet.roster();
    let table = &roster.models;
    let mut f = e.family(
        "loadlink_model_requests_total",
        MetricType::Counter,
        "Requests routed to each model (by its primary served name)",
    );
    for (name, s) in table.models() {
        f.sample(&[("model", &**name)], s.requests.load(Relaxed));
    }
    let mut f = e.family(
        "loadlink_model_workers",
        MetricType::Gauge,
        "Available workers serving each model",
    );
    for (name, _) in table.models() {
        let up = table
            .workers_of(name)
            .iter()
            .filter(|&&i| roster.workers[i as usize].available())
            .count();
        f.sample(&[("model", &**name)], up as u64);
    }
    let m = &st.fleet.models;
    let singles = [
        (
            "loadlink_model_not_found_total",
            "Requests answered 404 model_not_found: no worker serves the model they name",
            m.not_found.load(Relaxed),
        ),
        (
            "loadlink_model_required_total",
            "Requests answered 400: no model named among several (no --default-model), or an adapter name several models have",
            m.no_default.load(Relaxed),
        ),
        (
            "loadlink_model_refreshes_total",
            "Re-reads of every worker's models (--model-refresh-interval)",
            m.refreshes.load(Relaxed),
        ),
        (
            "loadlink_model_changes_total",
            "Workers found serving something else than before (re-registered)",
            m.changes.load(Relaxed),
        ),
        (
            "loadlink_model_read_errors_total",
            "Failed or refused reads of a worker's models (the last answer was kept)",
            m.errors.load(Relaxed),
        ),
    ];
    for (name, help, v) in singles {
        e.single(name, MetricType::Counter, help, v);
    }
}
