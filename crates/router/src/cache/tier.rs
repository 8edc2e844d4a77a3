//! Storage tiers of a cached block, as the index keeps them.
//!
//! Engines with a host tier (SGLang's HiCache) announce a block once per tier: `BlockStored`
//! with medium `CPU_PINNED` when a host copy lands, `BlockRemoved` (medium `GPU`) when the device
//! copy is evicted, `BlockRemoved(CPU_PINNED)` when the host copy goes, and `BlockStored(GPU)`
//! when a host block is loaded back. A block on the host is still a hit, but not a free one: it
//! has to be copied back before the prefill can use it. So the index answers two depths per slot,
//! the blocks on the device and the blocks on any tier.
//!
//! Only two tiers are kept: `DISK`, `EXTERNAL` and any other non-device medium count as the host
//! tier. A router prices them by one load-back bandwidth per worker; telling a disk from host
//! memory would need a second figure no engine advertises today.
//!
//! Nesting per tier: the device blocks of a slot are prefix-closed (an engine evicts device
//! leaves and loads back whole paths), and so are the blocks on any tier. The host blocks alone
//! are not: a demoted leaf sits on the host below a parent still on the device.

use super::id_hash::{IdMap, IdSet};
use super::index::Slot;

/// A tier a block is held on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Device memory (medium `GPU`, or no medium: engines without tiers omit it).
    Device,
    /// Anything off the device: `CPU_PINNED`, `DISK`, `EXTERNAL`.
    Host,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::Device, Tier::Host];

    /// The tier an event's `medium` names.
    pub fn of_medium(medium: Option<&str>) -> Tier {
        match medium {
            None | Some("GPU") => Tier::Device,
            Some(_) => Tier::Host,
        }
    }

    /// The label in `/workers` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
        }
    }
}

/// Where a slot's held blocks sit, beyond being held: all empty for an engine without a host
/// tier, so such a fleet pays nothing for tiers but one emptiness check per slot.
///
/// **A device removal must not orphan a host-only child.** After a resync the index may not know
/// that a block has a host copy (it was announced before the view began). When the engine then
/// evicts that block from the device it announces only the device removal. If the slot holds
/// host-only children of the block, the engine's own cache still holds the block (its tiers
/// together are prefix-closed), so it must be on the host: the index infers that copy rather than
/// drop the block under its children. The inferred copy's parent is unknown, so from then on the
/// slot's lookups scan instead of binary-searching (`unnested`) until it is cleared.
#[derive(Debug, Default)]
pub(super) struct SlotTiers {
    /// Blocks with a host copy (they may be on the device as well), with the parent their host
    /// store announced (`None`: a root, or an inferred copy).
    pub(super) host: IdMap<i64, Option<i64>>,
    /// Held blocks that are on the host only.
    pub(super) off_device: IdSet<i64>,
    /// Per block: how many of its children are held on the host only.
    host_only_children: IdMap<i64, u32>,
    /// A host copy was inferred (see above): nesting is no longer known to hold for this slot.
    pub(super) unnested: bool,
}

impl SlotTiers {
    /// Marks held block `h` as on the host only; false when it already was.
    pub(super) fn set_off_device(&mut self, h: i64) -> bool {
        if !self.off_device.insert(h) {
            return false;
        }
        if let Some(&Some(p)) = self.host.get(&h) {
            *self.host_only_children.entry(p).or_default() += 1;
        }
        true
    }

    /// Marks `h` as no longer on the host only (back on the device, or gone); false when it was
    /// not.
    pub(super) fn clear_off_device(&mut self, h: i64) -> bool {
        if !self.off_device.remove(&h) {
            return false;
        }
        if let Some(&Some(p)) = self.host.get(&h)
            && let Some(n) = self.host_only_children.get_mut(&p)
        {
            *n -= 1;
            if *n == 0 {
                self.host_only_children.remove(&p);
            }
        }
        true
    }

    /// Children of `h` held on the host only.
    pub(super) fn host_only_children(&self, h: i64) -> u32 {
        self.host_only_children.get(&h).copied().unwrap_or(0)
    }
}

/// One slot's cached prefix of a chain: blocks held on any tier, and on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TierMatch {
    pub slot: Slot,
    /// Leading blocks of the chain the slot holds on any tier.
    pub held: u32,
    /// Leading blocks of the chain the slot holds on the device (at most `held`).
    pub device: u32,
}
