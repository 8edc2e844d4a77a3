//! The burst of a live run (`bench live --burst`): issue 24's burst ([`Burst::DEFAULT`]: 30 s at
//! 1.5× the base load) fitted into a run of minutes, and its recovery figures per variant.
//!
//! The simulated burst starts after 300 s, which at time-scale 1 costs 5 minutes per variant
//! before anything happens. Live, the burst keeps its length and its peak-to-base ratio and
//! starts halfway through what is left of the run, on a window boundary:
//! `start = ⌊(duration − 30) / 2 / 10⌋ · 10`, at most [`Burst::DEFAULT`]'s 300 s. A 150 s run
//! then has 60 s before the burst (the pre-burst reference, [`BEFORE_S`]) and 60 s after it (the
//! recovery the acceptance asks for); a longer run splits the rest evenly.

use crate::sim::Outcome;
use crate::sweep::recovery::{BEFORE_S, Recovery, WINDOW_S, recovery};
use crate::workload::burst::Burst;

/// The shortest run a burst fits in: a window before, the burst, a window after.
pub const MIN_DURATION_S: f64 = Burst::DEFAULT.len_s + 2.0 * WINDOW_S;

/// The run's burst: [`Burst::DEFAULT`]'s length and peak-to-base ratio on `base`, placed by the
/// rule in the module docs. Refused below [`MIN_DURATION_S`]; a run shorter than
/// [`BEFORE_S`] + burst + [`BEFORE_S`] gives figures but no full pre-burst reference or
/// recovery window ([`Fit::short`]).
pub fn live_burst(duration_s: f64, base: f64) -> Result<Fit, String> {
    if duration_s.is_nan() || duration_s < MIN_DURATION_S {
        return Err(format!(
            "--duration {duration_s}: a burst run needs at least {MIN_DURATION_S} virtual s \
             ({} s of burst and a {WINDOW_S} s window either side)",
            Burst::DEFAULT.len_s
        ));
    }
    if !(base > 0.0 && base.is_finite()) {
        return Err(format!("--burst base load {base}: expected > 0"));
    }
    let d = Burst::DEFAULT;
    let half_rest = (duration_s - d.len_s) / 2.0;
    let start_s = ((half_rest / WINDOW_S).floor() * WINDOW_S).min(d.start_s);
    let burst = Burst {
        start_s,
        len_s: d.len_s,
        base,
        peak: base * d.peak / d.base,
    };
    let after = duration_s - start_s - d.len_s;
    Ok(Fit {
        burst,
        short: start_s < BEFORE_S || after < BEFORE_S,
    })
}

/// A burst fitted into a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub burst: Burst,
    /// Less than [`BEFORE_S`] before or after the burst: the figures are a dry run's.
    pub short: bool,
}

/// Each row's recovery figures (label, outcome) on `burst`, for a run of `duration_s`.
pub fn recoveries<'a>(
    rows: impl IntoIterator<Item = (&'a str, &'a Outcome)>,
    burst: &Burst,
    duration_s: f64,
) -> Vec<Recovery> {
    rows.into_iter()
        .map(|(label, o)| recovery(label, o, burst, duration_s))
        .collect()
}

/// The recovery table: per variant, the pre-burst p50, the worst window's, the recovery time
/// and the hit rate, then each window's p50.
pub fn recovery_table(rs: &[Recovery]) -> String {
    let mut s = format!(
        "{:<40} {:>11} {:>11} {:>11} {:>7}  p50 per {WINDOW_S} s window of arrivals\n",
        "variant", "before p50", "peak p50", "recovery", "hit"
    );
    for r in rs {
        let recovered = r
            .recovery_s
            .map_or_else(|| "never".to_string(), |x| format!("{x:.0} s"));
        let windows: Vec<String> = r.windows.iter().map(|w| format!("{w:.2}")).collect();
        s.push_str(&format!(
            "{:<40} {:>9.3} s {:>9.3} s {:>11} {:>6.1}%  {}\n",
            r.label,
            r.before_p50,
            r.peak_p50,
            recovered,
            100.0 * r.hit,
            windows.join(" ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_sits_on_a_window_boundary_with_room_either_side() {
        let fit = live_burst(150.0, 0.8).unwrap();
        assert_eq!(fit.burst.start_s, 60.0);
        assert_eq!(fit.burst.len_s, 30.0);
        assert!((fit.burst.peak - 1.2).abs() < 1e-12);
        assert!(!fit.short);
        // 180 s: 75 s either side, floored to the window: 70 s before, 80 s after.
        assert_eq!(live_burst(180.0, 0.9).unwrap().burst.start_s, 70.0);
        assert!((live_burst(180.0, 0.9).unwrap().burst.peak - 1.35).abs() < 1e-12);
        // Long runs keep the simulated burst's start.
        assert_eq!(live_burst(1000.0, 0.8).unwrap().burst, Burst::DEFAULT);
        // A dry run: it fits, but has no full reference or recovery window.
        let dry = live_burst(60.0, 0.8).unwrap();
        assert_eq!(dry.burst.start_s, 10.0);
        assert!(dry.short);
        assert!(live_burst(40.0, 0.8).unwrap_err().contains("at least 50"));
        assert!(live_burst(f64::NAN, 0.8).is_err());
        assert!(live_burst(150.0, 0.0).unwrap_err().contains("base load"));
    }

    #[test]
    fn the_table_names_each_variant_with_its_recovery() {
        let o = Outcome {
            arrived: (0..1500).map(|k| k as f64 * 0.1).collect(),
            ttft: (0..1500)
                .map(|k| if (600..1000).contains(&k) { 2.0 } else { 0.1 })
                .collect(),
            ..Outcome::default()
        };
        let b = live_burst(150.0, 0.8).unwrap().burst;
        let rs = recoveries([("a", &o)], &b, 150.0);
        assert_eq!(rs[0].recovery_s, Some(20.0));
        let t = recovery_table(&rs);
        assert!(t.contains("20 s"), "{t}");
        assert!(t.lines().nth(1).is_some_and(|l| l.starts_with('a')), "{t}");
    }
}
