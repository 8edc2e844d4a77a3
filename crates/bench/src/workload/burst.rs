//! A load burst: the same workload at a base load, sped up to a peak for a while, then back.
//! Built by warping time, not by drawing a second workload, so sessions stay whole (their turns
//! keep their order; think and tool times shrink with the clock during the burst) and the
//! arrivals before the burst are exactly the base run's.

use super::Arrival;

/// A burst of `len_s` seconds at `peak` from `start_s`, on a workload offered at `base` (loads as
/// fractions of capacity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    pub start_s: f64,
    pub len_s: f64,
    pub base: f64,
    pub peak: f64,
}

impl Burst {
    /// The issue-24 burst: 30 s at 120% after 300 s at 80%, then 80% again.
    pub const DEFAULT: Burst = Burst {
        start_s: 300.0,
        len_s: 30.0,
        base: 0.8,
        peak: 1.2,
    };

    /// Seconds of base-rate arrivals the warp consumes beyond the run's own duration: the burst
    /// packs `len_s · peak / base` of them into `len_s`.
    pub fn extra_s(&self) -> f64 {
        self.len_s * (self.speedup() - 1.0)
    }

    fn speedup(&self) -> f64 {
        (self.peak / self.base.max(1e-9)).max(1.0)
    }

    /// Where base-clock time `s` lands on the burst's clock.
    pub fn warp(&self, s: f64) -> f64 {
        let packed = self.len_s * self.speedup();
        if s < self.start_s {
            s
        } else if s < self.start_s + packed {
            self.start_s + (s - self.start_s) / self.speedup()
        } else {
            s - self.extra_s()
        }
    }

    /// `base_arrivals` (drawn at `base` over the run's duration + [`Burst::extra_s`]) on the
    /// burst's clock.
    pub fn apply(&self, mut base_arrivals: Vec<Arrival>) -> Vec<Arrival> {
        base_arrivals.iter_mut().for_each(|a| a.t = self.warp(a.t));
        base_arrivals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warp_is_monotone_and_packs_the_burst() {
        let b = Burst::DEFAULT;
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(b.extra_s(), 15.0));
        assert!(near(b.warp(100.0), 100.0));
        assert!(near(b.warp(300.0 + 45.0), 330.0));
        assert!(near(b.warp(400.0), 385.0));
        let mut prev = f64::NEG_INFINITY;
        for k in 0..10_000 {
            let t = b.warp(k as f64 * 0.07);
            assert!(t >= prev);
            prev = t;
        }
        // A steady stream at 1 arrival per 0.1 s: rates 10, 15, 10 per second.
        let arrivals: Vec<Arrival> = (0..6_150)
            .map(|k| Arrival {
                t: k as f64 * 0.1,
                prompt_tokens: 1,
                output_tokens: 1,
                stream: true,
                direct: false,
                prompt: None,
                turn: None,
                model: None,
            })
            .collect();
        let warped = b.apply(arrivals);
        let count = |a: f64, z: f64| warped.iter().filter(|x| (a..z).contains(&x.t)).count();
        let (before, burst, after) = (
            count(250.0, 300.0),
            count(300.0, 330.0),
            count(331.0, 381.0),
        );
        assert_eq!(before, 500);
        assert!(burst.abs_diff(450) <= 1, "{burst}");
        assert_eq!(after, 500);
    }
}
