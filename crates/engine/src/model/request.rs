//! What goes into the scheduler ([`Submit`]: a request, with its adapter and cache namespace)
//! and what comes out of a step ([`Step`], [`Event`]). Their own file so the scheduling logic in
//! `mod.rs` stays readable.

use crate::radix::PageChain;
use loadlink_wire::kv_namespace::Namespace;
use std::sync::Arc;

/// A request as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submit {
    pub id: u64,
    pub prompt_tokens: u64,
    pub max_new_tokens: u64,
    /// The prompt's token ids, when known (`prompt_tokens` is then their count). Without them the
    /// request can neither hit nor fill the prefix cache.
    pub prompt: Option<Arc<[u32]>>,
    /// The LoRA adapter it runs with: an index into the engine's adapter table (`None`: the base
    /// model). It runs only while that adapter is resident ([`super::LoraConfig`]).
    pub adapter: Option<u32>,
    /// Its cache namespace (`None`: the plain one): what keeps its cached pages apart from other
    /// namespaces' and how its KV events hash them ([`crate::page_chain`]). A request with an
    /// adapter should name it here too (`Namespace::lora`), as SGLang's `extra_key` carries it.
    pub namespace: Option<Arc<Namespace>>,
    /// Its part in prefill–decode disaggregation ([`Disagg::Local`]: none).
    pub disagg: Disagg,
}

/// A request's part in prefill–decode disaggregation: where its prompt KV is computed and where
/// it goes. The sockets that move the KV live outside the model; the model only knows which
/// queue the request waits in and what KV it holds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Disagg {
    /// Prefilled and decoded here (no disaggregation).
    #[default]
    Local,
    /// Prefilled here; then its KV stays held in the transfer ("inflight") queue until
    /// [`super::Scheduler::finish_transfer`], which finishes it with its one (first) token.
    Prefill,
    /// Its prompt KV comes from a prefill engine: it waits without KV until
    /// [`super::Scheduler::kv_arrived`], then is admitted straight into decode (no prefill).
    Decode,
}

impl Submit {
    /// The page hashes the scheduler matches and caches the prompt by: every full page of all
    /// but its last token (that one is always computed), in its namespace; empty without token
    /// ids.
    pub fn page_chain(&self, page_size: usize) -> PageChain {
        match self.prompt.as_deref() {
            Some(t) if !t.is_empty() => {
                PageChain::in_namespace(&t[..t.len() - 1], page_size, self.namespace.clone())
            }
            _ => PageChain::default(),
        }
    }

    /// A request known only by its token counts.
    pub fn counted(id: u64, prompt_tokens: u64, max_new_tokens: u64) -> Self {
        Submit {
            id,
            prompt_tokens,
            max_new_tokens,
            prompt: None,
            adapter: None,
            namespace: None,
            disagg: Disagg::Local,
        }
    }

    /// A request with its prompt's token ids.
    pub fn tokens(id: u64, prompt: Arc<[u32]>, max_new_tokens: u64) -> Self {
        Submit {
            id,
            prompt_tokens: prompt.len() as u64,
            max_new_tokens,
            prompt: Some(prompt),
            adapter: None,
            namespace: None,
            disagg: Disagg::Local,
        }
    }

    /// The same request, run with adapter `adapter` (an index into the engine's adapter table).
    pub fn with_adapter(mut self, adapter: u32) -> Self {
        self.adapter = Some(adapter);
        self
    }

    /// The same request, with part `disagg` in prefill–decode disaggregation.
    pub fn with_disagg(mut self, disagg: Disagg) -> Self {
        self.disagg = disagg;
        self
    }

    /// The same request, in cache namespace `namespace`.
    pub fn with_namespace(mut self, namespace: Arc<Namespace>) -> Self {
        self.namespace = Some(namespace);
        self
    }
}

/// Something a request's client should hear about; all happen at the end of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The first output token (end of prefill).
    FirstToken { id: u64 },
    /// One more output token.
    Token { id: u64 },
    /// Done; `completion_tokens` tokens were generated.
    Finished {
        id: u64,
        prompt_tokens: u64,
        completion_tokens: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Prefill,
    Decode,
    Idle,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub kind: StepKind,
    /// Seconds the step takes (0 when idle).
    pub duration: f64,
    pub events: Vec<Event>,
}
