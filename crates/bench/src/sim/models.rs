//! Many models and LoRA adapters in the simulator. Each engine serves one model
//! ([`super::SimConfig::served`]); a request's candidates are the engines serving the model it
//! names, as the router's per-model candidate lists make them. A request for an adapter reaches its
//! engine's scheduler with the adapter's index (the scheduler loads it when it is not resident and
//! counts the loads), and each router replica keeps the production
//! [`loadlink_router::adapters::AdapterBook`] of what it dispatched, which prices the adapter on
//! every candidate for the policy's view. Each engine advertises its adapter capacity and load time
//! to the book (as `/server_info`'s `max_loaded_loras` and `lora_load_time_s` do). With
//! [`super::SimConfig::adapter_reports_s`], every router also reads each engine's loaded adapters
//! that often (as the router's model refresh reads `loaded_loras`); without, the books run on their
//! dispatch history alone, the case of engines that report nothing.
//!
//! Adapter names beyond the book's bound are neither priced nor recorded (their loads still
//! happen in the engines). Direct (router-bypassing) traffic ignores models: scenarios with many models send none.

use crate::workload::Arrival;
use loadlink_engine::model::ModelConfig;
use loadlink_router::Worker;
use loadlink_router::adapters::{AdapterBook, AdapterBookConfig, AdapterCost, AdapterId};
use loadlink_router::candidate::{Candidate, Candidates};
use std::collections::HashMap;
use std::sync::Arc;

/// Per request, its model (an index into the served names) and adapter (a global index).
#[derive(Debug, Clone, Copy, Default)]
struct Named {
    model: usize,
    adapter: Option<u32>,
}

pub(crate) struct ModelRouting {
    /// Per arrival.
    named: Vec<Named>,
    /// Per model: its candidates (engines serving it, or their ranks); with one model served
    /// everywhere, the fleet's list as given.
    lists: Vec<Vec<Candidate>>,
    /// Per router replica: its adapter book; per adapter index: its id in every book.
    books: Vec<AdapterBook>,
    ids: Vec<Option<AdapterId>>,
    /// Per adapter index, its name in the books.
    names: Vec<String>,
    /// When the routers next read the engines' loaded adapters.
    next_report_s: f64,
}

impl ModelRouting {
    /// The routing of `arrivals` over a fleet of `workers` (one replica's book) whose engine `e`
    /// serves `served[e]` (empty: every engine serves every request) with `models[e]`; `all` is the
    /// fleet's candidate list (empty: one per engine).
    pub(crate) fn new(
        arrivals: &[Arrival],
        (served, models): (&[Arc<str>], &[ModelConfig]),
        (workers, all): (&[Arc<Worker>], &[Candidate]),
        replicas: usize,
        cfg: AdapterBookConfig,
    ) -> Self {
        let mut model_ix: HashMap<&str, usize> = HashMap::new();
        for name in served {
            let n = model_ix.len();
            model_ix.entry(name).or_insert(n);
        }
        let mut adapter_ix: HashMap<(&str, &str), u32> = HashMap::new();
        let named = arrivals
            .iter()
            .map(|a| match &a.model {
                Some(m) if !served.is_empty() => Named {
                    // A model no engine serves gets the index past the list: no candidates.
                    model: model_ix
                        .get(m.model.as_ref())
                        .copied()
                        .unwrap_or(usize::MAX),
                    adapter: m.adapter.as_deref().map(|ad| {
                        let n = adapter_ix.len() as u32;
                        *adapter_ix.entry((m.model.as_ref(), ad)).or_insert(n)
                    }),
                },
                _ => Named::default(),
            })
            .collect();
        let whole: Vec<Candidate>;
        let all = if all.is_empty() {
            whole = (0..workers.len() as u32)
                .map(|worker| Candidate { worker, rank: None })
                .collect();
            &whole[..]
        } else {
            all
        };
        let lists = match served.is_empty() {
            true => vec![all.to_vec()],
            false => {
                let mut lists = vec![Vec::new(); model_ix.len()];
                for c in all {
                    lists[model_ix[served[c.worker as usize].as_ref()]].push(*c);
                }
                lists
            }
        };
        let books: Vec<AdapterBook> = (0..replicas).map(|_| AdapterBook::new(cfg)).collect();
        let mut ids = vec![None; adapter_ix.len()];
        let mut names = vec![String::new(); adapter_ix.len()];
        for ((model, ad), &ix) in &adapter_ix {
            names[ix as usize] = format!("{model}:{ad}");
        }
        for book in &books {
            for (e, w) in workers.iter().enumerate() {
                let lora = models.get(e).map(|m| m.lora).unwrap_or_default();
                if lora.max_loaded > 0 {
                    book.configure(&w.url, Some(lora.max_loaded), Some(lora.load_time_s));
                }
            }
            // Interned in index order in every book, so one id stands for an adapter in all.
            for (ix, name) in names.iter().enumerate() {
                ids[ix] = book.intern(name);
            }
        }
        ModelRouting {
            named,
            lists,
            books,
            ids,
            names,
            next_report_s: 0.0,
        }
    }

    /// Request `i`'s candidates: the engines serving its model (empty: none does; a request that
    /// names no model goes to the first model's).
    pub(crate) fn candidates(&self, i: usize) -> &[Candidate] {
        self.lists
            .get(self.named[i].model)
            .map_or(&[], Vec::as_slice)
    }

    /// Request `i`'s adapter in the books (`None`: none, or past the books' bound).
    fn id(&self, i: usize) -> Option<AdapterId> {
        self.named[i].adapter.and_then(|a| self.ids[a as usize])
    }

    /// Request `i`'s adapter index for its engine's scheduler.
    pub(crate) fn adapter(&self, i: usize) -> Option<u32> {
        self.named[i].adapter
    }

    /// The seconds request `i`'s adapter costs on each of `targets`, as replica `r` believes, into
    /// `out` (left empty for a request without an adapter).
    pub(crate) fn fill_costs(
        &self,
        r: usize,
        i: usize,
        targets: Candidates<'_>,
        now_ms: u64,
        out: &mut Vec<AdapterCost>,
    ) {
        out.clear();
        if let Some(id) = self.id(i) {
            self.books[r].fill_costs(targets, id, now_ms, out);
        }
    }

    /// Request `i`, sent by replica `r` to candidate `c` of `worker` at `sent_ms`, finished.
    fn done(&self, r: usize, i: usize, worker: &Worker, c: Candidate, at: (u64, u64)) {
        if let Some(id) = self.id(i) {
            self.books[r].record_done(&worker.url, c.rank, id, at);
        }
    }

    /// Replica `r` sent request `i` to candidate `c` of `worker`.
    fn dispatched(&self, r: usize, i: usize, worker: &Worker, c: Candidate, now_ms: u64) {
        if let Some(id) = self.id(i) {
            self.books[r].record_dispatch(&worker.url, c.rank, id, now_ms);
        }
    }
}

impl super::Sim<'_> {
    /// Replica `r` sent request `i` to candidate `c` at `now_ms`: its adapter book records it.
    pub(super) fn adapter_dispatched(&mut self, r: usize, i: usize, c: Candidate, now_ms: u64) {
        let w = &self.books[r][c.worker as usize];
        self.models.dispatched(r, i, w, c, now_ms);
        self.reqs[i].routed = Some((r, c, now_ms));
    }

    /// Request `i` finished at `now_ms`: the book of the replica that sent it hears it.
    pub(super) fn adapter_done(&self, i: usize, now_ms: u64) {
        if let Some((r, c, sent)) = self.reqs[i].routed {
            let w = &self.books[r][c.worker as usize];
            self.models.done(r, i, w, c, (sent, now_ms));
        }
    }
}

impl super::Sim<'_> {
    /// When due at `t`, every router reads every engine's loaded adapters, one list per rank.
    pub(super) fn report_adapters(&mut self, t: f64) {
        let Some(every) = self.cfg.adapter_reports_s else {
            return;
        };
        if t < self.models.next_report_s {
            return;
        }
        self.models.next_report_s = t + every;
        let now = (t * 1000.0) as u64 + 1;
        for e in 0..self.layout.engines {
            let ranks: Vec<Vec<&str>> = (0..self.layout.ranks)
                .map(|rank| {
                    let loaded = self.engines[self.layout.unit(e, rank)].resident_adapters();
                    let name = |a: u32| self.models.names.get(a as usize).map(String::as_str);
                    loaded.into_iter().filter_map(name).collect()
                })
                .collect();
            for (book, workers) in self.models.books.iter().zip(&self.books) {
                book.report(&workers[e].url, &ranks, now);
            }
        }
    }
}
