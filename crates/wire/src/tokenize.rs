//! The simulated engine's tokenizer and chat template: deterministic, so a prefix cache (the
//! engine's, and a router's model of it) sees the reuse real traffic has. It lives in the wire
//! crate because the router must tokenize exactly as the engine does to know which cached blocks
//! a request reuses.
//!
//! * **Text.** Every 4 characters are one token (the usual rule of thumb for English BPE); the id
//!   is a hash of those characters. A prefix of a text therefore tokenizes to a prefix of the
//!   longer text's tokens, except possibly its last token when the prefix does not end on a
//!   4-character boundary (a partial chunk). Real BPE tokenizers have the same boundary effect.
//! * **Ids.** `input_ids` are taken as given. Text ids lie in `[FIRST_TEXT_ID, VOCAB)`; the ids
//!   below are the template's special tokens.
//! * **Chat.** Messages are rendered history-first, each as `<start> <role> content… <end>`, then
//!   the generation prompt `<start> <assistant>`. Each message's content is tokenized on its own,
//!   so it always starts on a token boundary: turn N+1's prompt extends turn N's prompt followed
//!   by its answer, as a real chat template's does.
//! * **Output.** The engine answers `" tok"` per generated token, which tokenizes back to
//!   [`OUTPUT_TOKEN`] each; a client that sends an answer back as the assistant message sends the
//!   very tokens the engine cached.

/// Token ids are below this (fits SGLang's u32 page hash input).
pub const VOCAB: u32 = 1 << 17;
pub const START: u32 = 1;
pub const END: u32 = 2;
pub const ROLE_SYSTEM: u32 = 3;
pub const ROLE_USER: u32 = 4;
pub const ROLE_ASSISTANT: u32 = 5;
pub const ROLE_OTHER: u32 = 6;
/// The first id text can map to.
pub const FIRST_TEXT_ID: u32 = 16;
/// What one generated token reads as.
pub const OUTPUT_TEXT: &str = " tok";
/// The id of [`OUTPUT_TEXT`].
pub const OUTPUT_TOKEN: u32 = chunk_id(OUTPUT_TEXT.as_bytes());

/// Characters per text token.
pub const CHARS_PER_TOKEN: usize = 4;

/// FNV-1a of `bytes`: stable across processes and versions (unlike the std hasher's random
/// seed), so what it keys is the same in every process that computes it.
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// [`fnv1a`] of a chunk's UTF-8 bytes, folded into the text id range.
const fn chunk_id(bytes: &[u8]) -> u32 {
    FIRST_TEXT_ID + (fnv1a(bytes) % (VOCAB - FIRST_TEXT_ID) as u64) as u32
}

/// Appends the tokens of `text` to `out`.
pub fn tokenize_into(text: &str, out: &mut Vec<u32>) {
    let mut start = 0;
    let mut chars = 0;
    for (i, c) in text.char_indices() {
        chars += 1;
        if chars == CHARS_PER_TOKEN {
            let end = i + c.len_utf8();
            out.push(chunk_id(&text.as_bytes()[start..end]));
            (start, chars) = (end, 0);
        }
    }
    if start < text.len() {
        out.push(chunk_id(&text.as_bytes()[start..]));
    }
}

pub fn tokenize(text: &str) -> Vec<u32> {
    let mut v = Vec::with_capacity(text.len() / CHARS_PER_TOKEN + 1);
    tokenize_into(text, &mut v);
    v
}

fn role_token(role: &str) -> u32 {
    match role {
        "system" | "developer" => ROLE_SYSTEM,
        "user" => ROLE_USER,
        "assistant" => ROLE_ASSISTANT,
        _ => ROLE_OTHER,
    }
}

/// Renders chat messages `(role, content)` history-first, with the generation prompt.
pub fn render_chat<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u32> {
    let mut out = Vec::new();
    for (role, content) in messages {
        out.extend([START, role_token(role)]);
        tokenize_into(content, &mut out);
        out.push(END);
    }
    out.extend([START, ROLE_ASSISTANT]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_tokenize_to_prefixes_on_chunk_boundaries() {
        let long = "The quick brown fox jumps over the lazy dog, twice: é ü 中文.";
        let all = tokenize(long);
        for (cut, _) in long.char_indices() {
            let p = tokenize(&long[..cut]);
            let whole = long[..cut].chars().count() / CHARS_PER_TOKEN;
            assert_eq!(p[..whole], all[..whole], "prefix of {cut} bytes");
        }
        assert_eq!(tokenize("abcdefghi").len(), 3);
        assert!(all.iter().all(|&t| (FIRST_TEXT_ID..VOCAB).contains(&t)));
    }

    #[test]
    fn the_next_turn_extends_this_turn_and_its_answer() {
        let turn1 = render_chat([("system", "be brief"), ("user", "hi there")]);
        let answer = OUTPUT_TEXT.repeat(5);
        let turn2 = render_chat([
            ("system", "be brief"),
            ("user", "hi there"),
            ("assistant", answer.as_str()),
            ("user", "and again?"),
        ]);
        let mut cached = turn1.clone();
        cached.extend(std::iter::repeat_n(OUTPUT_TOKEN, 5));
        assert_eq!(turn2[..cached.len()], cached[..]);
        assert_eq!(tokenize(&answer), vec![OUTPUT_TOKEN; 5]);
    }
}
