//! The index's answers to the request path: how deep each slot holds a request's chain, on any
//! tier and on the device (see the parent module's "Matching" for why a binary search suffices).

use super::*;

impl KvIndex {
    fn holds(&self, slot: Slot, hash: i64) -> bool {
        self.held
            .get(slot as usize)
            .is_some_and(|set| set.contains(&hash))
    }

    /// Number of leading blocks of `chain` with any holder entry (the deepest shared depth, an
    /// upper bound while detached entries remain).
    fn any_depth(&self, chain: &[i64]) -> usize {
        // First index with no holder, assuming nested holders along the chain.
        chain.partition_point(|h| self.blocks.contains_key(h))
    }

    /// For each slot holding at least the first block of `chain`: how many leading blocks it
    /// holds, written to `out` (cleared first; its capacity is reused).
    pub fn match_into(&self, chain: &[i64], out: &mut Vec<(Slot, u32)>) {
        out.clear();
        self.each_match(chain, |slot, held| out.push((slot, held as u32)));
    }

    /// As [`KvIndex::match_into`], with each slot's depth on the device beside its depth on any
    /// tier. The device depth costs a second binary search only for slots with blocks off the
    /// device.
    pub fn match_tiers_into(&self, chain: &[i64], out: &mut Vec<TierMatch>) {
        out.clear();
        self.each_match(chain, |slot, held| {
            let t = &self.tiers[slot as usize];
            let off = &t.off_device;
            let device = if off.is_empty() {
                held
            } else if t.unnested {
                chain[..held]
                    .iter()
                    .take_while(|h| !off.contains(h))
                    .count()
            } else {
                // Device blocks are prefix-closed within the held prefix.
                chain[..held].partition_point(|h| !off.contains(h))
            };
            out.push(TierMatch {
                slot,
                held: held as u32,
                device: device as u32,
            });
        });
    }

    /// Calls `f(slot, leading blocks held)` for each slot holding the first block of `chain`.
    fn each_match(&self, chain: &[i64], mut f: impl FnMut(Slot, usize)) {
        let depth = self.any_depth(chain);
        let Some(first) = chain.first().filter(|_| depth > 0) else {
            return;
        };
        let Some(candidates) = self.blocks.get(first) else {
            return;
        };
        let prefix = &chain[..depth];
        for &slot in candidates {
            let scan = self.tiers.get(slot as usize).is_some_and(|t| t.unnested);
            let held = if scan {
                prefix.iter().take_while(|&&h| self.holds(slot, h)).count()
            } else {
                prefix.partition_point(|&h| self.holds(slot, h))
            };
            if held > 0 {
                f(slot, held);
            }
        }
    }
}
