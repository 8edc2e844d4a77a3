//! What a fleet's prefix caches could reuse of a workload, estimated without running it. Scenarios
//! use it to calibrate their rate on the prompt tokens engines will actually compute, since with
//! a prefix cache the full prompt length overstates the work.

use super::{Arrival, Rng};
use loadlink_engine::tokenize::OUTPUT_TOKEN;
use loadlink_router::policy::mix;
use std::collections::HashSet;

/// Per-request means of a workload under [`blind_reuse`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReuseEstimate {
    pub mean_prompt: f64,
    /// Prompt tokens not found in the cache (what prefill computes).
    pub mean_uncached: f64,
    pub mean_output: f64,
}

impl ReuseEstimate {
    pub fn hit_rate(&self) -> f64 {
        if self.mean_prompt > 0.0 {
            1.0 - self.mean_uncached / self.mean_prompt
        } else {
            0.0
        }
    }
}

/// Reuse when every request goes to a uniformly random one of `engines` engines (what a router
/// blind to the caches achieves on average), each with an unbounded cache of full `page_size`
/// pages that holds every earlier request's prompt and output but its last token (what the
/// engine caches when a request finishes; requests are taken to finish before the next arrives).
/// Requests without token ids never hit.
pub fn blind_reuse(
    arrivals: &[Arrival],
    engines: usize,
    page_size: usize,
    seed: u64,
) -> ReuseEstimate {
    let page = page_size.max(1);
    let mut caches = vec![HashSet::<u64>::new(); engines.max(1)];
    let mut rng = Rng::new(seed ^ 0xb11d);
    let (mut prompt, mut uncached, mut output) = (0u64, 0u64, 0u64);
    for a in arrivals {
        prompt += a.prompt_tokens;
        output += a.output_tokens;
        let Some(ids) = &a.prompt else {
            uncached += a.prompt_tokens;
            continue;
        };
        let cache = &mut caches[(rng.next_u64() % engines.max(1) as u64) as usize];
        let answer = std::iter::repeat_n(OUTPUT_TOKEN, a.output_tokens.saturating_sub(1) as usize);
        let seq: Vec<u32> = ids.iter().copied().chain(answer).collect();
        let chain = page_chain(&seq, page);
        let hit_pages = chain[..ids.len() / page]
            .iter()
            .take_while(|h| cache.contains(h))
            .count();
        uncached += a.prompt_tokens - (hit_pages * page) as u64;
        cache.extend(chain);
    }
    let n = arrivals.len().max(1) as f64;
    ReuseEstimate {
        mean_prompt: prompt as f64 / n,
        mean_uncached: uncached as f64 / n,
        mean_output: output as f64 / n,
    }
}

/// One hash per full page, each covering every token before it too (a path in a radix tree).
fn page_chain(tokens: &[u32], page: usize) -> Vec<u64> {
    let mut h = 0x5eed_u64;
    tokens
        .chunks_exact(page)
        .map(|chunk| {
            for &t in chunk {
                h = mix(h.rotate_left(7) ^ t as u64);
            }
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(ids: Vec<u32>, output: u64) -> Arrival {
        Arrival {
            t: 0.0,
            prompt_tokens: ids.len() as u64,
            output_tokens: output,
            stream: true,
            direct: false,
            prompt: Some(ids.into()),
            turn: None,
            model: None,
        }
    }

    #[test]
    fn a_repeated_prefix_hits_by_whole_pages_and_unique_prompts_never_do() {
        let first: Vec<u32> = (100..140).collect(); // 40 tokens: 2 full pages of 16
        let mut second = first.clone();
        second.extend([OUTPUT_TOKEN; 3]); // the first answer (4 tokens, 3 cached) …
        second.extend(200..220); // … and a new message: 63 tokens
        let a = [arrival(first, 4), arrival(second, 1)];
        let one = blind_reuse(&a, 1, 16, 1);
        // The second request finds the first's 43 cached tokens: 2 full pages.
        assert_eq!(one.mean_uncached, (40.0 + 63.0 - 32.0) / 2.0);
        assert_eq!(one.mean_prompt, (40.0 + 63.0) / 2.0);
        let unique = [
            arrival((0..64).collect(), 2),
            arrival((64..128).collect(), 2),
        ];
        assert_eq!(blind_reuse(&unique, 1, 16, 1).hit_rate(), 0.0);
    }

    #[test]
    fn spreading_over_more_engines_finds_less() {
        let shared: Vec<u32> = (1000..1512).collect();
        let a: Vec<Arrival> = (0..400)
            .map(|i| {
                let mut p = shared.clone();
                p.extend([i as u32 + 20_000; 16]);
                arrival(p, 8)
            })
            .collect();
        let (one, eight) = (blind_reuse(&a, 1, 16, 3), blind_reuse(&a, 8, 16, 3));
        assert!(one.hit_rate() > 0.9, "{one:?}");
        assert!(eight.hit_rate() < one.hit_rate(), "{eight:?} vs {one:?}");
    }
}
