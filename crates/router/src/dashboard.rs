//! The live dashboard: one self-contained HTML page and a server-sent-events feed that pushes the
//! `/workers` document twice a second until the router stops.

use crate::admin::workers_json;
use crate::state::{AppState, error_response};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, Response};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// The live dashboard page (no external assets: everything is in this file).
const DASHBOARD: &str = include_str!("../assets/dashboard.html");

/// How often the feed sends the worker list.
const EVENT_PERIOD: Duration = Duration::from_millis(500);

pub async fn page() -> Html<&'static str> {
    Html(DASHBOARD)
}

/// Server-sent events for the dashboard: the `/workers` document every [`EVENT_PERIOD`].
pub async fn events(State(st): State<Arc<AppState>>) -> Response {
    let stream = futures_util::stream::unfold((st, true), |(st, first)| async move {
        if !first {
            tokio::time::sleep(EVENT_PERIOD).await;
        }
        if st.stopping.load(Relaxed) {
            return None;
        }
        let event = format!("data: {}\n\n", workers_json(&st));
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(event)),
            (st, false),
        ))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "building the event stream",
            )
        })
}
