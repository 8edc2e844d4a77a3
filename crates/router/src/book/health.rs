//! A worker's health as the router's health checks last saw it (`GET /health`). Apart from the
//! load belief and the breaker: health checks set it, picks read it, nothing else touches it.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

#[derive(Debug)]
pub struct Health(AtomicBool);

impl Default for Health {
    /// A new worker is assumed healthy until a check says otherwise.
    fn default() -> Self {
        Health(AtomicBool::new(true))
    }
}

impl Health {
    #[inline]
    pub fn is_healthy(&self) -> bool {
        self.0.load(Relaxed)
    }

    /// Records a check's outcome; true when it changed.
    pub fn set(&self, ok: bool) -> bool {
        self.0.swap(ok, Relaxed) != ok
    }
}
