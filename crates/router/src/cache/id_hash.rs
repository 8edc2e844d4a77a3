//! The one hasher for keys that are already unique, well-spread 64-bit ids: block hashes
//! (prefixes of SHA-256) and `Arc<Worker>` addresses. Hashing them again (SipHash) would only cost
//! time on the request path; one multiply spreads the bits a table uses.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// See the module docs.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(SPREAD);
        }
    }
    fn write_i64(&mut self, v: i64) {
        self.0 = (v as u64).wrapping_mul(SPREAD);
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(SPREAD);
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (v as u64).wrapping_mul(SPREAD);
    }
}

pub type IdBuild = BuildHasherDefault<IdHasher>;
pub type IdMap<K, V> = HashMap<K, V, IdBuild>;
pub type IdSet<K> = HashSet<K, IdBuild>;
