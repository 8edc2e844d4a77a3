//! A libzmq context sized for the fleet. The `zmq` crate cannot set `ZMQ_MAX_SOCKETS` (its
//! default, 1,023, silently capped the router at ~127 workers of 8 ranks), so this owns the raw
//! context through `zmq-sys`, sets the limit before the first socket exists (libzmq reads it once),
//! and hands out ordinary [`zmq::Socket`]s. Sockets made here do not keep the context alive: the
//! owner keeps an `Arc<FleetContext>` for as long as any socket lives (the ingest threads do).
//!
//! The limit cannot be raised once the context has a socket, so the fleet asks for libzmq's build
//! maximum (`ZMQ_SOCKET_LIMIT`) up front: libzmq's cost is a table of one pointer per socket, and
//! the process's descriptor limit, which can grow at runtime, is what binds.

use std::os::raw::{c_int, c_void};

/// A libzmq context with an explicit socket limit.
pub struct FleetContext {
    raw: *mut c_void,
    max_sockets: usize,
}

// libzmq contexts are thread-safe (sockets are not; each is owned by one thread).
unsafe impl Send for FleetContext {}
unsafe impl Sync for FleetContext {}

/// libzmq's own default socket limit.
pub const ZMQ_DEFAULT_MAX_SOCKETS: usize = zmq_sys::ZMQ_MAX_SOCKETS_DFLT as usize;

fn last_error() -> zmq::Error {
    zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })
}

impl FleetContext {
    /// A context allowing `max_sockets` sockets (clamped to libzmq's build limit) with
    /// `io_threads` I/O threads.
    pub fn new(max_sockets: usize, io_threads: usize) -> zmq::Result<Self> {
        let raw = unsafe { zmq_sys::zmq_ctx_new() };
        if raw.is_null() {
            return Err(last_error());
        }
        let mut ctx = FleetContext {
            raw,
            max_sockets: 0,
        };
        let limit = unsafe { zmq_sys::zmq_ctx_get(raw, zmq_sys::ZMQ_SOCKET_LIMIT as c_int) };
        let limit = if limit > 0 { limit as usize } else { 65_535 };
        let want = max_sockets.clamp(ZMQ_DEFAULT_MAX_SOCKETS, limit);
        ctx.set(zmq_sys::ZMQ_MAX_SOCKETS, want)?;
        ctx.set(zmq_sys::ZMQ_IO_THREADS, io_threads.max(1))?;
        ctx.max_sockets = want;
        Ok(ctx)
    }

    fn set(&self, option: u32, value: usize) -> zmq::Result<()> {
        let v = c_int::try_from(value).unwrap_or(c_int::MAX);
        match unsafe { zmq_sys::zmq_ctx_set(self.raw, option as c_int, v) } {
            -1 => Err(last_error()),
            _ => Ok(()),
        }
    }

    /// The socket limit in force.
    pub fn max_sockets(&self) -> usize {
        self.max_sockets
    }

    /// A new SUB socket (`EMFILE` once the limit is reached).
    pub fn sub_socket(&self) -> zmq::Result<zmq::Socket> {
        self.socket(zmq_sys::ZMQ_SUB)
    }

    /// A new DEALER socket (a KV-event replay request), like [`FleetContext::sub_socket`].
    pub fn dealer_socket(&self) -> zmq::Result<zmq::Socket> {
        self.socket(zmq_sys::ZMQ_DEALER)
    }

    /// A new PAIR socket (reading a socket monitor).
    pub fn pair_socket(&self) -> zmq::Result<zmq::Socket> {
        self.socket(zmq_sys::ZMQ_PAIR)
    }

    fn socket(&self, kind: u32) -> zmq::Result<zmq::Socket> {
        let s = unsafe { zmq_sys::zmq_socket(self.raw, kind as c_int) };
        if s.is_null() {
            return Err(last_error());
        }
        // SAFETY: `s` is a fresh socket owned by nobody else; the caller keeps this context alive
        // for as long as the socket (see the module docs).
        Ok(unsafe { zmq::Socket::from_raw(s) })
    }
}

impl Drop for FleetContext {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        // Blocks until every socket is closed; they have linger 0, so it does not wait on peers.
        while unsafe { zmq_sys::zmq_ctx_term(self.raw) } == -1 {
            if unsafe { zmq_sys::zmq_errno() } != libc::EINTR {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_sockets_than_the_libzmq_default() {
        let ctx = FleetContext::new(1500, 1).unwrap();
        assert!(ctx.max_sockets() >= 1500);
        let socks: Vec<_> = (0..1100).map(|_| ctx.sub_socket().unwrap()).collect();
        assert_eq!(socks.len(), 1100);
        drop(socks);
    }

    #[test]
    fn the_default_limit_is_what_capped_the_fleet() {
        let ctx = FleetContext::new(10, 1).unwrap();
        assert_eq!(
            ctx.max_sockets(),
            ZMQ_DEFAULT_MAX_SOCKETS,
            "never below the default"
        );
        let made: Vec<_> = (0..1100).map(|_| ctx.sub_socket()).collect();
        assert!(
            made.iter().any(|s| matches!(s, Err(zmq::Error::EMFILE))),
            "libzmq refuses sockets beyond its limit"
        );
    }
}
