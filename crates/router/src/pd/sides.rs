//! A PD fleet's two candidate sets. Each side is a [`Roster`] of its own over the same workers
//! (the same `Arc`s, so load, in-flight counts and cache slots are shared with the whole fleet):
//! its candidate list, ranked or whole, and its model table. A PD request then resolves its model
//! on each side, and each side's policy, cache lookup, admission caps and in-flight guards run on
//! that side's candidates exactly as a regular request's run on the fleet's. Built with the
//! roster (on membership changes), so a request pays nothing for the split.

use super::Role;
use crate::book::Worker;
use crate::candidate::{RankField, Roster};
use std::sync::Arc;

/// The prefill and decode sides of a roster.
#[derive(Debug)]
pub struct PdSides {
    pub prefill: Arc<Roster>,
    pub decode: Arc<Roster>,
}

impl PdSides {
    /// The sides of `workers` by their roles; `None` when no worker is prefill or decode.
    pub fn of(
        workers: &[Arc<Worker>],
        field: RankField,
        epoch: u64,
        models: &crate::models::registry::Registry,
    ) -> Option<Self> {
        let of = |role: Role| -> Vec<Arc<Worker>> {
            workers
                .iter()
                .filter(|w| w.pd.role() == role)
                .cloned()
                .collect()
        };
        let (prefill, decode) = (of(Role::Prefill), of(Role::Decode));
        if prefill.is_empty() && decode.is_empty() {
            return None;
        }
        Some(PdSides {
            prefill: Arc::new(Roster::flat(prefill, field, epoch, models, true)),
            decode: Arc::new(Roster::flat(decode, field, epoch, models, true)),
        })
    }

    /// The side of `role` (`None` for regular).
    pub fn side(&self, role: Role) -> Option<&Arc<Roster>> {
        match role {
            Role::Prefill => Some(&self.prefill),
            Role::Decode => Some(&self.decode),
            Role::Regular => None,
        }
    }
}
