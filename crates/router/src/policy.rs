//! Routing policies. Pure: `pick(view, entropy)` with no I/O, no clock and no allocation, so the
//! same code runs in the live router and in a simulator. The view carries the loads (already
//! merged by the `LoadBook`, with `now` baked in); `entropy` is a per-request number (the router
//! uses its request sequence), from which the randomised policies derive their choices.

/// What a policy may look at.
pub trait View {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The load of worker `i` on the configured signal.
    fn load(&self, i: usize) -> i64;
    /// Whether worker `i` may take traffic now (healthy, breaker closed, not excluded).
    fn available(&self, i: usize) -> bool;
    /// Prompt tokens of the request being placed (0 when the router does not know them).
    fn prompt_tokens(&self) -> u64 {
        0
    }
    /// Tokens of this request's prompt believed cached on worker `i` (from the KV index, or the
    /// approximate tree for workers without KV events); 0 when unknown.
    fn cached_tokens(&self, _i: usize) -> u64 {
        0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    Random,
    PowerOfTwo,
    LeastLoad,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "round_robin" => Ok(Policy::RoundRobin),
            "random" => Ok(Policy::Random),
            "power_of_two" => Ok(Policy::PowerOfTwo),
            "least_load" => Ok(Policy::LeastLoad),
            o => Err(format!(
                "unknown policy {o:?}; expected round_robin, random, power_of_two or least_load"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::Random => "random",
            Policy::PowerOfTwo => "power_of_two",
            Policy::LeastLoad => "least_load",
        }
    }

    /// The chosen worker, or `None` when none is available.
    pub fn pick(self, view: &impl View, entropy: u64) -> Option<usize> {
        let n = view.len();
        if n == 0 {
            return None;
        }
        let first = match self {
            Policy::RoundRobin => (entropy % n as u64) as usize,
            Policy::Random => (mix(entropy) % n as u64) as usize,
            Policy::PowerOfTwo => {
                let h = mix(entropy);
                let a = (h % n as u64) as usize;
                // A second, distinct index from the other half of the hash.
                let b = if n > 1 {
                    (a + 1 + ((h >> 32) % (n as u64 - 1)) as usize) % n
                } else {
                    a
                };
                match (view.available(a), view.available(b)) {
                    (true, true) => {
                        let (la, lb) = (view.load(a), view.load(b));
                        if la < lb || (la == lb && h & (1 << 63) == 0) {
                            a
                        } else {
                            b
                        }
                    }
                    (true, false) => a,
                    (false, true) => b,
                    (false, false) => return least_available(view, entropy),
                }
            }
            Policy::LeastLoad => return least_available(view, entropy),
        };
        if view.available(first) {
            return Some(first);
        }
        // The natural choice is unavailable: walk on from it.
        (1..n).map(|k| (first + k) % n).find(|&i| view.available(i))
    }
}

/// The available worker with the least load; ties broken by rotating the start with `entropy`.
fn least_available(view: &impl View, entropy: u64) -> Option<usize> {
    let n = view.len();
    let start = (entropy % n as u64) as usize;
    let mut best: Option<(i64, usize)> = None;
    for k in 0..n {
        let i = (start + k) % n;
        if !view.available(i) {
            continue;
        }
        let l = view.load(i);
        if best.is_none_or(|(bl, _)| l < bl) {
            best = Some((l, i));
        }
    }
    best.map(|(_, i)| i)
}

/// splitmix64: a fast, well-mixed hash of the request sequence.
#[inline]
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct V(Vec<(i64, bool)>);
    impl View for V {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn load(&self, i: usize) -> i64 {
            self.0[i].0
        }
        fn available(&self, i: usize) -> bool {
            self.0[i].1
        }
    }

    #[test]
    fn each_policy_respects_availability_and_load() {
        let v = V(vec![(5, true), (1, true), (9, false), (3, true)]);
        assert_eq!(Policy::LeastLoad.pick(&v, 7), Some(1));
        for e in 0..1000 {
            for p in [
                Policy::RoundRobin,
                Policy::Random,
                Policy::PowerOfTwo,
                Policy::LeastLoad,
            ] {
                assert_ne!(p.pick(&v, e), Some(2), "{p:?} picked an unavailable worker");
            }
        }
        assert_eq!(Policy::PowerOfTwo.pick(&V(vec![(0, false); 4]), 1), None);
        assert_eq!(Policy::RoundRobin.pick(&V(vec![]), 1), None);
    }

    #[test]
    fn power_of_two_prefers_the_lighter_of_two_and_spreads_ties() {
        let v = V(vec![(100, true), (0, true)]);
        assert!((0..100).all(|e| Policy::PowerOfTwo.pick(&v, e) == Some(1)));
        let even = V(vec![(0, true); 8]);
        let mut hits = [0; 8];
        for e in 0..8000 {
            hits[Policy::PowerOfTwo.pick(&even, e).unwrap()] += 1;
        }
        assert!(
            hits.iter().all(|&h| h > 700),
            "ties spread evenly: {hits:?}"
        );
        let rr: Vec<_> = (0..4)
            .map(|e| Policy::RoundRobin.pick(&even, e).unwrap())
            .collect();
        assert_eq!(rr, [0, 1, 2, 3]);
    }
}
