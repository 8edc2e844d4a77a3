//! Free TCP port blocks for the demo, the live benchmark and the tests.
//!
//! An engine's load range is `dp_size` consecutive ports derived from its KV-events port, so a
//! caller that starts engines on a shared machine needs a *block* of free ports, not one. Fixed
//! ports in the ephemeral range collide with whatever else runs there (a CI run failed on exactly
//! that), and two callers in one process could be handed overlapping blocks because the check
//! releases the ports again. This module asks the OS for a base, checks the whole block by binding
//! it, and never hands the same port out twice within a process.

use std::net::TcpListener;
use std::sync::Mutex;

/// Ports already handed out by this process.
static HANDED_OUT: Mutex<Vec<(u16, u16)>> = Mutex::new(Vec::new());

/// A base port such that `base..base + n` were all free on every interface when checked, and none
/// of them was handed out before by this process.
pub fn free_port_block(n: u16) -> Result<u16, String> {
    let n = n.max(1);
    for _ in 0..500 {
        let base = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("asking the OS for a free port: {e}"))?
            .port();
        let Some(end) = base.checked_add(n) else {
            continue;
        };
        let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if handed.iter().any(|&(b, e)| base < e && b < end) {
            continue;
        }
        // Hold every port of the block at once so the check sees one consistent state.
        let held: Result<Vec<_>, _> = (base..end)
            .map(|p| TcpListener::bind(("0.0.0.0", p)))
            .collect();
        if held.is_ok() {
            handed.push((base, end));
            return Ok(base);
        }
    }
    Err(format!("no block of {n} free ports found in 500 tries"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_never_overlap_within_a_process() {
        let blocks: Vec<(u16, u16)> = (0..50)
            .map(|_| {
                let b = free_port_block(4).unwrap();
                (b, b + 4)
            })
            .collect();
        for (i, a) in blocks.iter().enumerate() {
            for b in &blocks[i + 1..] {
                assert!(a.1 <= b.0 || b.1 <= a.0, "{a:?} overlaps {b:?}");
            }
        }
        let b = free_port_block(3).unwrap();
        for p in b..b + 3 {
            TcpListener::bind(("0.0.0.0", p)).expect("a handed-out port is bindable");
        }
    }
}
