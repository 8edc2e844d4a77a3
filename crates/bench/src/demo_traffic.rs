//! What `loadlink demo`'s clients send: one short chat prompt over and over (`single`, load only),
//! or multi-turn chat sessions of a few tenants, each tenant with its own long system prompt
//! (`chat`: the prefix reuse a cache-aware router is for).
//!
//! A chat client keeps its conversation: each turn sends the system prompt, every earlier turn
//! and the engine's answers (as the engine wrote them, so they tokenize back to what it cached),
//! and a new question. After [`TURNS`] turns it starts a new session.

use loadlink_wire::tokenize::OUTPUT_TEXT;
use serde_json::{Value, json};

/// The demo's traffic shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DemoWorkload {
    /// One short prompt: no reuse, load alone decides.
    #[default]
    Single,
    /// Multi-turn sessions of 4 tenants with ~1,500-token system prompts.
    Chat,
}

impl DemoWorkload {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "single" => Ok(DemoWorkload::Single),
            "chat" => Ok(DemoWorkload::Chat),
            o => Err(format!("--workload {o:?}: expected single or chat")),
        }
    }
}

/// Turns per chat session.
pub const TURNS: usize = 5;
/// Tenants, each with its own system prompt.
pub const TENANTS: usize = 4;

/// One client's stream of request bodies.
pub struct Conversation {
    workload: DemoWorkload,
    client: usize,
    session: usize,
    messages: Vec<Value>,
}

impl Conversation {
    pub fn new(workload: DemoWorkload, client: usize) -> Self {
        Conversation {
            workload,
            client,
            session: 0,
            messages: Vec::new(),
        }
    }

    /// The next request body.
    pub fn next_body(&mut self, max_tokens: u64) -> Value {
        if self.workload == DemoWorkload::Single {
            return json!({"messages": [{"role": "user", "content": "Tell me about load balancing."}],
                          "max_tokens": max_tokens, "stream": true});
        }
        if self.messages.len() > 2 * TURNS || self.messages.is_empty() {
            self.session += 1;
            let tenant = self.client % TENANTS;
            self.messages = vec![json!({"role": "system", "content": system_prompt(tenant)})];
        }
        let turn = self.messages.len() / 2;
        self.messages.push(json!({"role": "user", "content": format!(
            "Client {} session {} question {turn}: how should this fleet route the next request?",
            self.client, self.session
        )}));
        json!({"messages": self.messages, "max_tokens": max_tokens, "stream": true})
    }

    /// The engine answered the last request with `tokens` tokens: the next turn carries them.
    pub fn answered(&mut self, tokens: u64) {
        if self.workload == DemoWorkload::Chat {
            let content = OUTPUT_TEXT.repeat(tokens as usize);
            self.messages
                .push(json!({"role": "assistant", "content": content}));
        }
    }
}

/// Tenant `t`'s system prompt: ~1,500 tokens of text no other tenant shares.
fn system_prompt(t: usize) -> String {
    let line = format!("Tenant {t} policy: answer briefly, cite the runbook, never guess. ");
    line.repeat(6000 / line.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_turn_extends_the_last_with_its_answer() {
        let mut c = Conversation::new(DemoWorkload::Chat, 1);
        let t1 = c.next_body(3);
        c.answered(3);
        let t2 = c.next_body(3);
        let (m1, m2) = (
            t1["messages"].as_array().unwrap(),
            t2["messages"].as_array().unwrap(),
        );
        assert_eq!(m2[..m1.len()], m1[..]);
        assert_eq!(m2[m1.len()]["content"], OUTPUT_TEXT.repeat(3));
        let mut turns = 2;
        loop {
            c.answered(3);
            if c.next_body(3)["messages"].as_array().unwrap().len() == 2 {
                break;
            }
            turns += 1;
        }
        assert_eq!(turns, TURNS, "a new session starts after {TURNS} turns");
        assert!(
            DemoWorkload::parse("x")
                .unwrap_err()
                .contains("single or chat")
        );
    }
}
