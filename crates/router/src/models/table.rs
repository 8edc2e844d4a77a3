//! The fleet's model table: which candidates serve which model and adapter, built with the roster
//! (when membership or a worker's models change), so a request resolves its `model` to a ready
//! candidate list with a few hash lookups and no allocation.
//!
//! **Names.** A worker is reached under any name it publishes for its base model: its served names
//! and its model path. A model is listed (and counted in `/metrics`) under its primary served name.
//! **Adapters** are reached as SGLang spells them (`model: "base:adapter"`, or `lora_path` in the
//! body) and as vLLM does (`model: "adapter"`). **Workers that name no model** (an engine without
//! model routes, or one whose answer was refused) serve whatever no other worker names: a fleet
//! that publishes nothing is routed as before, and one that publishes is never sent a request for a
//! model another worker serves to a worker that has not said it serves it.

use super::served::ServedModels;
use crate::book::Worker;
use crate::candidate::{Candidate, CandidateList, Candidates};
use loadlink_wire::kv_namespace::LoraRef;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The workers that hold a name, and the primary name of the first of them.
type Holders = (Vec<u32>, Arc<str>);

/// Counters of one model (by primary name), kept across roster rebuilds.
#[derive(Debug, Default)]
pub struct ModelStats {
    pub requests: AtomicU64,
}

/// The candidate lists of one set of workers.
#[derive(Debug, Default)]
struct TargetSet {
    workers: Vec<u32>,
    whole: Vec<Candidate>,
    ranked: Vec<Candidate>,
}

/// A set of workers: every worker (the roster's own lists), or one of the table's sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetId {
    All,
    Set(u32),
}

/// Where one name leads.
#[derive(Debug, Clone)]
struct Entry {
    set: SetId,
    model: Arc<str>,
}

/// What a request asked for, resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub set: SetId,
    /// The model's primary name (`None`: routing by model is off, no worker names one).
    pub model: Option<Arc<str>>,
    /// The adapter, when the request asked for one.
    pub adapter: Option<Arc<str>>,
}

/// Why a request's model has no candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// No worker serves it (the name, as asked).
    NotFound(String),
    /// No model was named and the fleet serves several (their names).
    NoDefault(Vec<String>),
    /// An adapter named alone (vLLM's form) that several base models have (the name, the bases).
    Ambiguous(String, Vec<String>),
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ModelTable {
    sets: Vec<TargetSet>,
    by_name: HashMap<Arc<str>, Entry>,
    /// vLLM-style adapter names, as `model`.
    by_adapter: HashMap<Arc<str>, Entry>,
    /// Base name, then adapter: the workers that serve both.
    by_pair: HashMap<Arc<str>, HashMap<Arc<str>, Entry>>,
    /// Workers that name no model: what an unnamed model may go to.
    unnamed: Option<SetId>,
    /// Primary names in first-seen order, with their worker sets and counters.
    models: Vec<(Arc<str>, SetId, Arc<ModelStats>)>,
    workers: usize,
    /// Each adapter's namespace by base model (the first worker's that names it with an id or
    /// path).
    loras: HashMap<Arc<str>, HashMap<Arc<str>, LoraRef>>,
    /// The base models (primary names) of each adapter name.
    adapter_bases: HashMap<Arc<str>, Vec<Arc<str>>>,
}

impl ModelTable {
    /// The table of `workers` (their served models by `served`), over their candidate list;
    /// `stats` keeps each model's counters across rebuilds (models no worker names any more are
    /// dropped from it).
    pub fn build(
        workers: &[Arc<Worker>],
        candidates: &CandidateList,
        served: &HashMap<String, Arc<ServedModels>>,
        stats: &mut HashMap<Arc<str>, Arc<ModelStats>>,
    ) -> Self {
        let mut t = ModelTable {
            workers: workers.len(),
            ..Default::default()
        };
        let of = |i: usize| served.get(&workers[i].url).filter(|s| s.is_known());
        let mut names: HashMap<Arc<str>, Holders> = HashMap::new();
        let mut adapters: HashMap<Arc<str>, Holders> = HashMap::new();
        let mut pairs: HashMap<(Arc<str>, Arc<str>), Holders> = HashMap::new();
        let mut unnamed = Vec::new();
        let mut primaries: Vec<Arc<str>> = Vec::new();
        for i in 0..workers.len() {
            let Some(s) = of(i) else {
                unnamed.push(i as u32);
                continue;
            };
            let primary = s.names[0].clone();
            if !primaries.contains(&primary) {
                primaries.push(primary.clone());
            }
            for n in &s.names {
                let e = names
                    .entry(n.clone())
                    .or_insert((Vec::new(), primary.clone()));
                e.0.push(i as u32);
                for a in &s.adapters {
                    let key = (n.clone(), a.name.clone());
                    let p = pairs.entry(key).or_insert((Vec::new(), primary.clone()));
                    p.0.push(i as u32);
                }
            }
            for a in &s.adapters {
                let e = adapters
                    .entry(a.name.clone())
                    .or_insert((Vec::new(), primary.clone()));
                e.0.push(i as u32);
                if let Some(l) = &a.lora {
                    let of_base = t.loras.entry(primary.clone()).or_default();
                    of_base.entry(a.name.clone()).or_insert_with(|| l.clone());
                }
                let bases = t.adapter_bases.entry(a.name.clone()).or_default();
                if !bases.contains(&primary) {
                    bases.push(primary.clone());
                }
            }
        }
        let n = workers.len();
        let set_of = |t: &mut ModelTable, ws: Vec<u32>| -> SetId {
            if ws.len() == n {
                return SetId::All;
            }
            if let Some(at) = t.sets.iter().position(|s| s.workers == ws) {
                return SetId::Set(at as u32);
            }
            t.sets.push(TargetSet::of(ws, candidates));
            SetId::Set(t.sets.len() as u32 - 1)
        };
        for (name, (ws, model)) in names {
            let set = set_of(&mut t, ws);
            t.by_name.insert(name, Entry { set, model });
        }
        for (name, (ws, model)) in adapters {
            let set = set_of(&mut t, ws);
            t.by_adapter.insert(name, Entry { set, model });
        }
        for ((base, adapter), (ws, model)) in pairs {
            let set = set_of(&mut t, ws);
            let entry = Entry { set, model };
            t.by_pair.entry(base).or_default().insert(adapter, entry);
        }
        if !unnamed.is_empty() {
            t.unnamed = Some(set_of(&mut t, unnamed));
        }
        stats.retain(|k, _| primaries.contains(k));
        t.models = primaries
            .into_iter()
            .map(|p| {
                let set = t.by_name[&p].set;
                let s = stats.entry(p.clone()).or_default().clone();
                (p, set, s)
            })
            .collect();
        t
    }

    /// The namespace of the adapter `name`, as its workers' engines hash it; one no worker names
    /// gets a namespace of the router's own (its cache is kept apart and matches no engine's).
    pub fn lora(&self, model: Option<&str>, name: &str) -> LoraRef {
        let known = model.and_then(|m| self.loras.get(m)?.get(name));
        known.cloned().unwrap_or_else(|| LoraRef {
            name: name.to_string(),
            id: format!("loadlink-router-unnamed-adapter:{name}"),
        })
    }

    /// Whether some worker lists the adapter `name`.
    pub fn knows_adapter(&self, name: &str) -> bool {
        self.adapter_bases.contains_key(name)
    }

    /// Whether any worker names a model (else routing by model is off).
    pub fn routes_by_model(&self) -> bool {
        !self.models.is_empty()
    }

    /// The models, by primary name, with their counters.
    pub fn models(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<ModelStats>)> {
        self.models.iter().map(|(n, _, s)| (n, s))
    }

    /// The counters of the model `name` (a primary name).
    pub fn stats(&self, name: &str) -> Option<&Arc<ModelStats>> {
        self.models
            .iter()
            .find(|(n, ..)| &**n == name)
            .map(|m| &m.2)
    }

    /// The workers (indices) that serve the model `name` (a primary name).
    pub fn workers_of(&self, name: &str) -> Vec<u32> {
        match self.models.iter().find(|(n, ..)| &**n == name) {
            Some((_, SetId::Set(i), _)) => self.sets[*i as usize].workers.clone(),
            Some((_, SetId::All, _)) => (0..self.workers as u32).collect(),
            None => Vec::new(),
        }
    }

    /// The candidates of `set` over `all` (the roster's lists).
    pub fn targets<'a>(
        &'a self,
        set: SetId,
        all: Candidates<'a>,
        all_ranked: &'a [Candidate],
        ranked: bool,
    ) -> Candidates<'a> {
        match set {
            SetId::All if ranked => Candidates::listed(all.workers(), all_ranked),
            SetId::All => Candidates::whole(all.workers()),
            SetId::Set(i) => {
                let s = &self.sets[i as usize];
                let list = if ranked { &s.ranked } else { &s.whole };
                Candidates::listed(all.workers(), list)
            }
        }
    }

    /// Resolves a request's `model` (absent or SGLang's `"default"`: the default model) and its
    /// body's `lora_path`; `default_model` is `--default-model`.
    pub fn resolve(
        &self,
        model: Option<&str>,
        lora_path: Option<&str>,
        default_model: Option<&str>,
    ) -> Result<Resolved, Unresolved> {
        let lora = lora_path.filter(|p| !p.is_empty()).map(Arc::from);
        if !self.routes_by_model() {
            return Ok(Resolved {
                set: SetId::All,
                model: None,
                adapter: lora,
            });
        }
        let named = model.filter(|m| !m.is_empty() && *m != "default");
        let name = match (named, default_model) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) if self.models.len() == 1 => &*self.models[0].0,
            (None, None) => {
                return Err(Unresolved::NoDefault(
                    self.models.iter().map(|m| m.0.to_string()).collect(),
                ));
            }
        };
        let found = |e: &Entry, adapter: Option<Arc<str>>| Resolved {
            set: e.set,
            model: Some(e.model.clone()),
            adapter,
        };
        if let Some(base) = self.by_name.get(name) {
            // An adapter named in `lora_path` narrows to the workers that list it; one nobody
            // lists may be a path the engine loads on demand (SGLang), so the base's set stays.
            let pair = lora.as_ref().and_then(|a| self.pair(name, a));
            return Ok(found(pair.unwrap_or(base), lora));
        }
        if let Some((base, adapter)) = self.split_adapter(name) {
            return match self.pair(base, adapter) {
                Some(e) => Ok(found(e, Some(Arc::from(adapter)))),
                None => Err(Unresolved::NotFound(name.to_string())),
            };
        }
        // A bare name with a `lora_path` beside it: SGLang takes the adapter from `lora_path`
        // (only `base:adapter` in `model` wins over it), so the router routes for that one.
        let name = match &lora {
            Some(l) if self.by_adapter.contains_key(name) => &**l,
            _ => name,
        };
        if let Some(e) = self.by_adapter.get(name) {
            // Two models' adapters of one name are different adapters: the bare name cannot say
            // which, and serving it by both would mix them.
            if let Some(bases) = self.adapter_bases.get(name).filter(|b| b.len() > 1) {
                let bases = bases.iter().map(|b| b.to_string()).collect();
                return Err(Unresolved::Ambiguous(name.to_string(), bases));
            }
            return Ok(found(e, Some(Arc::from(name))));
        }
        match self.unnamed {
            Some(set) => Ok(Resolved {
                set,
                model: None,
                adapter: lora,
            }),
            None => Err(Unresolved::NotFound(name.to_string())),
        }
    }

    fn pair(&self, base: &str, adapter: &str) -> Option<&Entry> {
        self.by_pair.get(base)?.get(adapter)
    }

    /// `base:adapter` split as SGLang splits it: after the longest known base name followed by a
    /// colon (names may hold colons, as URIs do), else at the first colon.
    fn split_adapter<'n>(&self, name: &'n str) -> Option<(&'n str, &'n str)> {
        let known = name
            .match_indices(':')
            .map(|(i, _)| i)
            .rev()
            .find(|&i| self.by_name.contains_key(&name[..i]));
        let at = known.or_else(|| name.find(':'))?;
        let (base, adapter) = (name[..at].trim(), name[at + 1..].trim());
        (!adapter.is_empty()).then_some((base, adapter))
    }
}

impl TargetSet {
    fn of(workers: Vec<u32>, all: &CandidateList) -> Self {
        let whole = workers
            .iter()
            .map(|&w| Candidate {
                worker: w,
                rank: None,
            })
            .collect();
        let ranked = all
            .ranked
            .iter()
            .filter(|c| workers.binary_search(&c.worker).is_ok())
            .copied()
            .collect();
        TargetSet {
            workers,
            whole,
            ranked,
        }
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
