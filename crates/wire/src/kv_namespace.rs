//! Cache namespaces: how a request's LoRA adapter, `extra_key` and `cache_salt` keep its prefix
//! cache apart, and the block hashes SGLang 0.5.23 publishes for it.
//!
//! Two requests with the same tokens share cached KV only when they are in the same namespace: an
//! adapter changes every layer's KV, and `cache_salt`/`extra_key` are how a client asks for a cache
//! of its own. In SGLang the namespace is the pair `(extra_key, cache_salt)` of the radix key, where
//! a LoRA request's `extra_key` is the client's `extra_key` (or `""`) followed by the adapter's
//! `lora_id` (`Req.__init__`). An adapter given by `--lora-paths name=path` has a deterministic id,
//! the hex of `uuid5(NAMESPACE_URL, "{name}\0{path}")`, so a router can name it without asking.
//!
//! The KV events of the default `kv_events_config` format carry namespaces this way:
//! * the page chain starts from `sha256("sglang-cache-salt-v1\0" + cache_salt)` instead of
//!   nothing when the request has a `cache_salt` ([`salt_prior`]); `extra_key` is not hashed;
//! * when the request has an adapter, every published hash (block and parent) is then
//!   re-hashed with a seed of the namespace ([`namespace_seed`] of `extra_key` alone,
//!   [`namespaced_block_hash`]).
//!
//! So in that format a request with an `extra_key` and no adapter publishes the same hashes as a
//! plain one, though the engine keeps the two apart: a router can tell adapters and salts apart
//! from the events, not bare `extra_key`s. [`Namespace::event_hashes`] is the one place that
//! computes a request's published hashes; the engine publishes them and the router looks them up.

use crate::kv_events::{block_hash, page_digest};
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// The seed tag of `kv_event_namespace_seed` (SGLang `disaggregation/kv_events.py`).
const NAMESPACE_SEED_TAG: &[u8] = b"sglang-kv-event-namespace-v1";
/// The prefix of a salted chain's first prior (SGLang `mem_cache/utils.py`).
const SALT_PRIOR_TAG: &[u8] = b"sglang-cache-salt-v1\0";
/// RFC 4122's URL namespace, `6ba7b811-9dad-11d1-80b4-00c04fd430c8`.
const NAMESPACE_URL: [u8; 16] = [
    0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8,
];

/// The `lora_id` SGLang gives an adapter loaded by `--lora-paths name=path`: the 32 hex digits of
/// `uuid5(NAMESPACE_URL, "{name}\0{path}")`.
pub fn lora_id(name: &str, path: &str) -> String {
    let mut h = Sha1::new();
    h.update(NAMESPACE_URL);
    h.update(name.as_bytes());
    h.update([0u8]);
    h.update(path.as_bytes());
    let d = h.finalize();
    let mut u = [0u8; 16];
    u.copy_from_slice(&d[..16]);
    u[6] = (u[6] & 0x0f) | 0x50;
    u[8] = (u[8] & 0x3f) | 0x80;
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first prior of a salted page chain.
pub fn salt_prior(cache_salt: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(SALT_PRIOR_TAG);
    h.update(cache_salt.as_bytes());
    h.finalize().into()
}

/// SGLang's `kv_event_namespace_seed`: `None` when both parts are absent. Each part is written as
/// a presence byte and, when present, its UTF-8 length (8 bytes little-endian) and bytes, so
/// `("a", "bc")` and `("ab", "c")` differ.
pub fn namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<[u8; 32]> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut h = Sha256::new();
    h.update(NAMESPACE_SEED_TAG);
    for part in [extra_key, cache_salt] {
        match part {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
    }
    Some(h.finalize().into())
}

/// SGLang's `namespaced_block_hash`: `hash` itself without a seed, else the first 8 bytes of
/// `sha256(seed + hash as 8 big-endian bytes)` as a signed big-endian integer.
pub fn namespaced_block_hash(hash: i64, seed: Option<&[u8; 32]>) -> i64 {
    let Some(seed) = seed else { return hash };
    let mut h = Sha256::new();
    h.update(seed);
    h.update(hash.to_be_bytes());
    block_hash(&h.finalize().into())
}

/// The block hashes of every full page of `tokens`, chained from `prior` (the root when `None`).
pub fn page_hashes_from(tokens: &[u32], page_size: usize, prior: Option<&[u8; 32]>) -> Vec<i64> {
    let mut prior = prior.copied();
    tokens
        .chunks_exact(page_size.max(1))
        .map(|page| {
            let d = page_digest(prior.as_ref(), page);
            prior = Some(d);
            block_hash(&d)
        })
        .collect()
}

/// An adapter as a namespace knows it: its name (what events carry as `lora_name`) and its id
/// (what joins the `extra_key`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoraRef {
    pub name: String,
    pub id: String,
}

impl LoraRef {
    /// An adapter loaded by `--lora-paths name=path`, with SGLang's deterministic id.
    pub fn from_path(name: &str, path: &str) -> Self {
        LoraRef {
            name: name.to_string(),
            id: lora_id(name, path),
        }
    }
}

/// A request's cache namespace: its client `extra_key`, `cache_salt` and adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Namespace {
    pub extra_key: Option<String>,
    pub cache_salt: Option<String>,
    pub lora: Option<LoraRef>,
}

impl Namespace {
    /// No adapter, salt or key: the shared namespace.
    pub fn is_plain(&self) -> bool {
        self.extra_key.is_none() && self.cache_salt.is_none() && self.lora.is_none()
    }

    /// The engine's `extra_key`: the client's, followed by the adapter's id.
    pub fn engine_extra_key(&self) -> Option<String> {
        match (&self.extra_key, &self.lora) {
            (k, None) => k.clone(),
            (k, Some(l)) => Some(format!("{}{}", k.as_deref().unwrap_or(""), l.id)),
        }
    }

    /// The first prior of the request's page chain (`Some` with a `cache_salt`).
    pub fn prior(&self) -> Option<[u8; 32]> {
        self.cache_salt.as_deref().map(salt_prior)
    }

    /// The seed its published hashes are re-hashed with (`Some` only with an adapter).
    pub fn event_seed(&self) -> Option<[u8; 32]> {
        self.lora.as_ref()?;
        namespace_seed(self.engine_extra_key().as_deref(), None)
    }

    /// The block hashes the engine publishes for `tokens` in this namespace.
    pub fn event_hashes(&self, tokens: &[u32], page_size: usize) -> Vec<i64> {
        let mut hashes = page_hashes_from(tokens, page_size, self.prior().as_ref());
        if let Some(seed) = self.event_seed() {
            for h in &mut hashes {
                *h = namespaced_block_hash(*h, Some(&seed));
            }
        }
        hashes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::page_hashes;

    #[test]
    fn a_plain_namespace_publishes_the_plain_chain() {
        let t: Vec<u32> = (0..40).collect();
        assert_eq!(Namespace::default().event_hashes(&t, 4), page_hashes(&t, 4));
        // An extra_key alone is not in the published hashes (SGLang's default format).
        let keyed = Namespace {
            extra_key: Some("k".into()),
            ..Default::default()
        };
        assert!(!keyed.is_plain());
        assert_eq!(keyed.event_hashes(&t, 4), page_hashes(&t, 4));
    }

    #[test]
    fn salts_and_adapters_each_change_every_hash() {
        let t: Vec<u32> = (0..40).collect();
        let plain = page_hashes(&t, 4);
        let salted = Namespace {
            cache_salt: Some("s".into()),
            ..Default::default()
        };
        let lora = Namespace {
            lora: Some(LoraRef::from_path("a", "/p/a")),
            ..Default::default()
        };
        let other = Namespace {
            lora: Some(LoraRef::from_path("b", "/p/b")),
            ..Default::default()
        };
        let sets = [
            plain,
            salted.event_hashes(&t, 4),
            lora.event_hashes(&t, 4),
            other.event_hashes(&t, 4),
        ];
        for i in 0..sets.len() {
            for j in i + 1..sets.len() {
                assert!(sets[i].iter().all(|h| !sets[j].contains(h)), "{i} vs {j}");
            }
        }
    }

    #[test]
    fn the_uuid5_is_well_formed_and_depends_on_name_and_path() {
        let id = lora_id("a", "/p");
        assert_eq!(id.len(), 32);
        assert_eq!(&id[12..13], "5", "version nibble");
        assert!(matches!(&id[16..17], "8" | "9" | "a" | "b"), "variant bits");
        assert_ne!(id, lora_id("a", "/q"));
        assert_ne!(lora_id("ab", "c"), lora_id("a", "bc"));
    }

    /// Figures from Python's `uuid.uuid5` and SGLang's `kv_event_namespace_seed` /
    /// `namespaced_block_hash` (the interop suite checks the engine's events against the modules).
    #[test]
    fn matches_python_on_known_values() {
        assert_eq!(lora_id("a", "/p"), "ffb671b63704506c99265cec9c098738");
        let seed = namespace_seed(Some("abc"), None).unwrap();
        assert_eq!(
            namespaced_block_hash(12345, Some(&seed)),
            4_776_658_742_472_864_742
        );
        assert_eq!(namespaced_block_hash(12345, None), 12345);
    }
}
