//! Many models behind one router: tags a workload's requests with the model each names and, for a
//! model serving LoRA adapters, the adapter it asks for, drawn by Zipf popularity. Kept apart from
//! how prompts are drawn, so any workload can be spread over a fleet of models.

use super::{Arrival, ModelRef, Rng};
use std::sync::Arc;

/// One model of a mix: its share of the requests and its adapters.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShare {
    /// The served name (`--served-model-name`).
    pub name: &'static str,
    /// Its share of the requests (the shares of a mix need not sum to 1).
    pub share: f64,
    /// LoRA adapters of this model (0: none); adapter k (from 0) is [`adapter_name`]`(k)`.
    pub adapters: usize,
    /// Adapter k is asked for with probability ∝ 1 / (k + 1)^zipf_s.
    pub zipf_s: f64,
    /// Of this model's requests, the share on the base model (the rest name an adapter).
    pub base_share: f64,
}

/// The name of adapter `k` of a model: `tenant-07`.
pub fn adapter_name(k: usize) -> String {
    format!("tenant-{k:02}")
}

/// A cumulative distribution over `weights`, drawn by binary search.
struct Cdf(Vec<f64>);

impl Cdf {
    fn new(weights: impl Iterator<Item = f64>) -> Self {
        let mut acc = 0.0;
        let mut c: Vec<f64> = weights
            .map(|w| {
                acc += w.max(0.0);
                acc
            })
            .collect();
        let total = acc.max(f64::MIN_POSITIVE);
        c.iter_mut().for_each(|x| *x /= total);
        Cdf(c)
    }

    fn draw(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.0
            .partition_point(|&x| x < u)
            .min(self.0.len().saturating_sub(1))
    }
}

/// Tags every arrival with a model of `mix` (by share) and, for models with adapters, an adapter
/// (by Zipf) or the base model; deterministic for `seed`. Arrivals keep their times and prompts.
pub fn assign_models(arrivals: &mut [Arrival], mix: &[ModelShare], seed: u64) {
    if mix.is_empty() {
        return;
    }
    let mut rng = Rng::new(seed ^ 0x6d6f_6465_6c73);
    let models = Cdf::new(mix.iter().map(|m| m.share));
    let names: Vec<Arc<str>> = mix.iter().map(|m| Arc::from(m.name)).collect();
    let adapters: Vec<(Vec<Arc<str>>, Cdf)> = mix
        .iter()
        .map(|m| {
            let names = (0..m.adapters).map(|k| adapter_name(k).into()).collect();
            let zipf = (0..m.adapters).map(|k| 1.0 / ((k + 1) as f64).powf(m.zipf_s));
            (names, Cdf::new(zipf))
        })
        .collect();
    for a in arrivals.iter_mut() {
        let m = models.draw(&mut rng);
        let (list, cdf) = &adapters[m];
        let adapter = match list.is_empty() || rng.unit() < mix[m].base_share {
            true => None,
            false => Some(list[cdf.draw(&mut rng)].clone()),
        };
        a.model = Some(ModelRef {
            model: names[m].clone(),
            adapter,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Pattern, WorkloadSpec, generate};

    #[test]
    fn models_follow_their_shares_and_adapters_their_zipf() {
        let spec = WorkloadSpec {
            seed: 3,
            duration_s: 1000.0,
            rate: 40.0,
            pattern: Pattern::Poisson,
            prompt_median: 100.0,
            prompt_sigma: 0.5,
            output_median: 10.0,
            output_sigma: 0.5,
            max_tokens: 1000,
            stream_fraction: 1.0,
            direct_fraction: 0.0,
        };
        let mut a = generate(&spec);
        let untagged = a.clone();
        let mix = [
            ModelShare {
                name: "big",
                share: 1.0,
                adapters: 0,
                zipf_s: 0.0,
                base_share: 1.0,
            },
            ModelShare {
                name: "base",
                share: 3.0,
                adapters: 32,
                zipf_s: 1.1,
                base_share: 0.0,
            },
        ];
        assign_models(&mut a, &mix, 7);
        let n = a.len() as f64;
        let named = |m: &'static str| {
            a.iter()
                .filter(move |x| x.model.as_ref().unwrap().model.as_ref() == m)
        };
        assert!((named("big").count() as f64 / n - 0.25).abs() < 0.01);
        assert!(named("big").all(|x| x.model.as_ref().unwrap().adapter.is_none()));
        let count = |k: usize| {
            let name = adapter_name(k);
            named("base")
                .filter(|x| x.model.as_ref().unwrap().adapter.as_deref() == Some(name.as_str()))
                .count() as f64
        };
        // Zipf 1.1 over 32: adapter 0 takes 28.4% of the model's requests, adapter 1 is 2^1.1
        // times rarer.
        let base = named("base").count() as f64;
        assert!(
            (count(0) / base - 0.284).abs() < 0.015,
            "{}",
            count(0) / base
        );
        assert!((count(0) / count(1) - 2f64.powf(1.1)).abs() < 0.2);
        assert!(count(31) > 0.0, "the tail is drawn too");
        // Times and prompts unchanged; the same seed tags the same way.
        assert!(
            a.iter()
                .zip(&untagged)
                .all(|(x, y)| x.t == y.t && x.prompt_tokens == y.prompt_tokens)
        );
        let mut again = untagged.clone();
        assign_models(&mut again, &mix, 7);
        assert_eq!(again, a);
    }
}
