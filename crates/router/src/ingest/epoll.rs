//! The two kernel objects an ingest thread waits on, wrapped so the rest is safe code: an epoll
//! set (edge-triggered registrations of libzmq's `ZMQ_FD`s) and an eventfd that wakes the thread
//! when a command is queued.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An epoll set.
pub struct Epoll {
    fd: OwnedFd,
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Epoll {
    pub fn new() -> io::Result<Self> {
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `fd` for readability, edge-triggered, reporting `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: token,
        };
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })
            .map(drop)
    }

    /// Stops watching `fd` (before the socket that owns it is closed).
    pub fn remove(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits for ready tokens (up to `out`'s capacity); `timeout_ms` −1 waits forever.
    pub fn wait(&self, out: &mut Vec<u64>, events: &mut [libc::epoll_event], timeout_ms: i32) {
        out.clear();
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                timeout_ms,
            )
        };
        for ev in events.iter().take(n.max(0) as usize) {
            out.push(ev.u64);
        }
    }
}

/// An eventfd used as a doorbell.
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    pub fn new() -> io::Result<Self> {
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Doorbell {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Resets the counter (non-blocking).
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    }
}
