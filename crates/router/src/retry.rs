//! When the proxy tries another worker, and how long it waits first: which upstream statuses are
//! worth a retry, the backoff between attempts, and the answer once every attempt failed.

use crate::policy::mix;
use crate::state::{AppState, error_response};
use axum::http::StatusCode;
use axum::response::Response;
use std::time::Duration;

/// 502, 503 and 504: the worker (or something in front of it) could not serve this time.
pub(crate) fn retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Exponential backoff with jitter derived from the request sequence (no RNG on the request path).
pub(crate) struct Backoff {
    delay: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(initial_ms: u64, max_ms: u64) -> Self {
        Backoff {
            delay: Duration::from_millis(initial_ms),
            max: Duration::from_millis(max_ms),
        }
    }

    pub(crate) async fn wait(&mut self, seq: u64) {
        let jitter = (mix(seq) % 1000) as f64 / 1000.0;
        tokio::time::sleep(self.delay.mul_f64(0.5 + jitter / 2.0)).await;
        self.delay = (self.delay * 2).min(self.max);
    }
}

/// The 502 after every attempt failed (or none could be made).
pub(crate) fn all_failed(st: &AppState, last_error: &str) -> Response {
    st.metrics.count_status(502);
    let msg = if last_error.is_empty() {
        "no worker is available (all unhealthy or their breakers are open)".to_string()
    } else {
        format!("every attempt failed; last: {last_error}")
    };
    error_response(StatusCode::BAD_GATEWAY, &msg)
}
