//! A worker's KV-event streams as the fleet opens them: which host to dial (the worker URL's, unless
//! an advertised one is trusted and routable) and the slots and SUBs of each rank.

use super::Fleet;
use crate::book::Worker;
use crate::budget::Refusal;
use crate::ingest::kv::KvSubscription;
use crate::subscribe::SocketBounds;
use loadlink_wire::discovery::KvStreams;
use std::sync::Arc;

impl Fleet {
    /// Slots and connected SUBs for `worker`'s KV streams, or `None` (with the reason recorded in
    /// the cache book).
    pub(super) fn kv_subscription(
        &self,
        worker: &Arc<Worker>,
        kv: Result<KvStreams, String>,
    ) -> Option<KvSubscription> {
        let opened = kv.and_then(|mut streams| {
            self.choose_kv_host(worker, &mut streams);
            let (_, ctx) = self
                .ingest()
                .map_err(|e| format!("cannot subscribe: {e}"))?;
            let bounds = SocketBounds::kv(&self.budgets);
            crate::ingest::kv::subscribe(&self.cache, ctx, worker, &streams, bounds)
        });
        match opened {
            Ok(sub) => Some(sub),
            Err(why) => {
                tracing::debug!(worker = %worker.url, "no KV-event stream: {why}");
                self.cache.no_stream(&worker.url, why);
                None
            }
        }
    }

    /// Dials the worker URL's host for KV events unless the worker advertised another one that
    /// the operator trusts (`Budgets::trust_advertised_hosts`) and that is routable; an advertised
    /// host not dialled is counted as [`Refusal::UntrustedHost`] with both hosts named.
    fn choose_kv_host(&self, worker: &Worker, streams: &mut KvStreams) {
        let Some(advertised) = streams.advertised.as_ref().map(|a| a.host.clone()) else {
            return;
        };
        if self.budgets.trust_advertised_hosts && streams.dial_advertised() {
            tracing::info!(worker = %worker.url, "KV events: dialling the advertised host {advertised}");
            return;
        }
        let why = if self.budgets.trust_advertised_hosts {
            "it is not routable"
        } else {
            "advertised hosts are not trusted (--trust-advertised-hosts)"
        };
        worker.refusals.refuse(Refusal::UntrustedHost, || {
            format!(
                "KV events advertised on host {advertised:?} are read from the worker URL's host instead: {why}"
            )
        });
    }
}
