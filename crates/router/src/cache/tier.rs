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

use super::id_hash::IdSet;
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

/// Where a slot's held blocks sit, beyond being held: both sets are empty for an engine without
/// a host tier, so such a fleet pays nothing for tiers but one emptiness check per slot.
#[derive(Debug, Default)]
pub(super) struct SlotTiers {
    /// Blocks with a host copy (they may be on the device as well).
    pub(super) host: IdSet<i64>,
    /// Held blocks that are on the host only.
    pub(super) off_device: IdSet<i64>,
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
