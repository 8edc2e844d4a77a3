//! What the live run reads off the processes' `/metrics` pages, with the strict parser: the
//! routers' decision counters and the engines' prefix-cache token counters.

use loadlink_wire::prom;

/// A process's `/metrics`, read with the strict parser.
pub(crate) async fn scrape(c: &reqwest::Client, url: &str) -> Result<prom::Scrape, String> {
    let text = c
        .get(format!("{url}/metrics"))
        .send()
        .await
        .map_err(|e| format!("{url}/metrics: {e}"))?
        .text()
        .await
        .map_err(|e| format!("{url}/metrics: {e}"))?;
    prom::parse(&text).map_err(|e| format!("{url}/metrics: {e}"))
}

/// A router's counter `name` (unlabelled) from its `/metrics`.
pub(super) async fn metric(c: &reqwest::Client, url: &str, name: &str) -> Result<f64, String> {
    scrape(c, url)
        .await?
        .value(name, &[])
        .ok_or_else(|| format!("{url}/metrics has no single sample {name}"))
}

/// An engine's lifetime `(cached, prompt)` tokens, summed over its ranks; `None` when its page
/// lacks either counter.
fn cache_counters(page: &prom::Scrape) -> Option<(f64, f64)> {
    let sum = |name| {
        let mut samples = page.samples(name).peekable();
        samples.peek()?;
        Some(samples.map(|s| s.value).sum::<f64>())
    };
    Some((
        sum("loadlink_engine_cache_hit_tokens_total")?,
        sum("loadlink_engine_prompt_tokens_total")?,
    ))
}

/// The fleet's lifetime `(cached, prompt)` tokens; `None` when any engine does not say.
pub(crate) async fn fleet_cache_counters(
    c: &reqwest::Client,
    engines: &[String],
) -> Option<(f64, f64)> {
    let mut total = (0.0, 0.0);
    for u in engines {
        let (cached, prompt) = cache_counters(&scrape(c, u).await.ok()?)?;
        total = (total.0 + cached, total.1 + prompt);
    }
    Some(total)
}

/// The adapter loads the fleet's engines have done in their lifetime
/// (`loadlink_engine_lora_loads_total`, summed over engines and ranks); `None` when an engine does
/// not say.
pub(crate) async fn fleet_adapter_loads(c: &reqwest::Client, engines: &[String]) -> Option<f64> {
    let mut total = 0.0;
    for u in engines {
        let page = scrape(c, u).await.ok()?;
        total += page
            .samples("loadlink_engine_lora_loads_total")
            .map(|s| s.value)
            .sum::<f64>();
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_counters_sum_the_ranks_and_are_unknown_when_absent() {
        let mut page = prom::Exposition::new();
        let counters = [
            ("loadlink_engine_cache_hit_tokens_total", [30.0, 10.0]),
            ("loadlink_engine_prompt_tokens_total", [100.0, 60.0]),
        ];
        for (name, values) in counters {
            let mut f = page.family(name, prom::MetricType::Counter, "tokens");
            for (rank, v) in values.into_iter().enumerate() {
                f.sample(&[("dp_rank", rank)], v);
            }
        }
        let page = prom::parse(&page.finish()).unwrap();
        assert_eq!(cache_counters(&page), Some((40.0, 160.0)));
        let mut other = prom::Exposition::new();
        other.single(
            "loadlink_engine_prompt_tokens_total",
            prom::MetricType::Counter,
            "tokens",
            5.0,
        );
        assert_eq!(cache_counters(&prom::parse(&other.finish()).unwrap()), None);
    }
}
