//! `decode_load`: the default policy of a PD fleet's decode side. A decode engine never prefills a
//! transferred prompt, so the prefill backlog and the prefix cache `min_ttft` prices say nothing
//! about it. What slows a decode engine's next token is the batch it runs, the KV it has left and
//! the requests already committed to it whose KV is still on its way. So:
//!
//! ```text
//! cost(i) = requests(i) + pending(i) + kv_requests · max(0, kv(i) − kv_from) / (1 − kv_from)
//! ```
//! * `requests(i)`: the engine's running + waiting requests plus this router's dispatches since
//!   the snapshot ([`View::engine_requests`]);
//! * `pending(i)`: requests waiting for their KV there (the snapshot's `disaggregation` section:
//!   pre-allocation and transfer queues, [`View::pending_transfers`]): each will join the batch;
//! * the KV term: from `kv_from` usage to full, up to `kv_requests` requests' worth (a full pool
//!   stalls admission and retracts running requests).
//!
//! A worker whose engine load is stale is priced on this router's open requests there, as every
//! policy falls back. Ties (equal costs) are broken by rotating the start with the entropy, so
//! replicas seeing the same numbers spread their picks.

use super::{View, argmin_by};

/// `decode_load`'s parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeLoad {
    /// Requests' worth a full KV pool costs.
    pub kv_requests: f64,
    /// KV usage (0–1) from which it costs.
    pub kv_from: f64,
}

impl Default for DecodeLoad {
    fn default() -> Self {
        DecodeLoad {
            kv_requests: 32.0,
            kv_from: 0.5,
        }
    }
}

impl DecodeLoad {
    /// Candidate `i`'s cost (see the module docs).
    pub fn cost(&self, view: &impl View, i: usize) -> f64 {
        let p = view.price(i);
        let Some(requests) = p.engine_requests else {
            return p.inflight as f64;
        };
        let pending = view.pending_transfers(i).unwrap_or(0).max(0);
        let over = ((p.kv_usage - self.kv_from) / (1.0 - self.kv_from).max(1e-9)).clamp(0.0, 1.0);
        requests.max(0) as f64 + pending as f64 + self.kv_requests * over
    }

    /// The available candidate with the least cost.
    pub fn pick(&self, view: &impl View, entropy: u64) -> Option<usize> {
        argmin_by(view, entropy, |i| self.cost(view, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Price;

    /// Candidates with engine requests (None: stale), pending transfers, KV usage and in-flight.
    struct Fleet(Vec<(Option<i64>, i64, f64, i64)>);

    impl View for Fleet {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn load(&self, i: usize) -> i64 {
            self.0[i].3
        }
        fn available(&self, _: usize) -> bool {
            true
        }
        fn price(&self, i: usize) -> Price {
            let (e, _, kv, f) = self.0[i];
            Price {
                queued_s: e.map(|_| 0.0),
                engine_requests: e,
                s_per_token: 0.0,
                kv_usage: kv,
                inflight: f,
                utilisation: None,
                free_pool_tokens: None,
            }
        }
        fn pending_transfers(&self, i: usize) -> Option<i64> {
            self.0[i].0.map(|_| self.0[i].1)
        }
    }

    #[test]
    fn pending_transfers_and_kv_pressure_count_as_requests() {
        let p = DecodeLoad::default();
        // Same running requests: the one waiting for KV transfers loses.
        let f = Fleet(vec![(Some(4), 6, 0.1, 0), (Some(4), 0, 0.1, 0)]);
        assert_eq!(p.pick(&f, 0), Some(1));
        assert_eq!(p.cost(&f, 0), 10.0);
        // Fewer requests but a nearly full pool: the emptier pool wins.
        let f = Fleet(vec![(Some(2), 0, 0.95, 0), (Some(8), 0, 0.2, 0)]);
        assert_eq!(p.pick(&f, 0), Some(1));
        assert!((p.cost(&f, 0) - (2.0 + 32.0 * 0.9)).abs() < 1e-9);
        // Stale: priced on in-flight.
        let f = Fleet(vec![(None, 99, 0.99, 3), (Some(5), 0, 0.0, 0)]);
        assert_eq!((p.cost(&f, 0), p.pick(&f, 0)), (3.0, Some(0)));
    }
}
