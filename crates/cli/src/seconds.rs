//! Flags given in seconds (`--duration`, `--drain-delay`, `--drain-timeout`, `wire listen
//! --timeout`), checked when they
//! are read: a value a `Duration` cannot hold (`inf`, `NaN`, `1e300`, a negative number) must fail
//! at start naming the flag, not panic at shutdown when it is first turned into a `Duration`.

use loadlink_router::config::drain_seconds;

/// The longest `--duration`: about 31 years (longer is "until stopped", which is 0).
const MAX_RUN_SECONDS: f64 = 1e9;

/// `--drain-delay`: seconds, 0 to a day.
pub fn drain_delay(s: &str) -> Result<f64, String> {
    drain("--drain-delay", s)
}

/// `--drain-timeout`: seconds, 0 to a day.
pub fn drain_timeout(s: &str) -> Result<f64, String> {
    drain("--drain-timeout", s)
}

fn drain(flag: &str, s: &str) -> Result<f64, String> {
    let secs = number(flag, s)?;
    drain_seconds(flag, secs).map(|_| secs)
}

/// `--duration`: seconds to run, 0 (until stopped) to about 31 years.
pub fn run_duration(s: &str) -> Result<f64, String> {
    check_run_duration(number("--duration", s)?)
}

/// [`run_duration`] for a value that is a number already (from a `--config` file).
pub fn check_run_duration(secs: f64) -> Result<f64, String> {
    up_to_forever("--duration", secs)
}

/// `wire listen --timeout`: seconds, 0 (never) to about 31 years.
pub fn listen_timeout(s: &str) -> Result<f64, String> {
    up_to_forever("--timeout", number("--timeout", s)?)
}

/// `secs` for a flag where 0 means "no end": 0 to [`MAX_RUN_SECONDS`].
fn up_to_forever(flag: &str, secs: f64) -> Result<f64, String> {
    if (0.0..=MAX_RUN_SECONDS).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!(
            "{flag}: expected seconds between 0 (no end) and {MAX_RUN_SECONDS}, got {secs:?}"
        ))
    }
}

fn number(flag: &str, s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("{flag}: expected a number of seconds, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_durations_are_refused_with_the_flag_named() {
        assert_eq!(drain_timeout("30"), Ok(30.0));
        assert_eq!(drain_delay("0"), Ok(0.0));
        assert_eq!(run_duration("0.5"), Ok(0.5));
        for bad in ["inf", "NaN", "-1", "1e300", "x"] {
            assert!(
                drain_timeout(bad)
                    .unwrap_err()
                    .starts_with("--drain-timeout: ")
            );
            assert!(drain_delay(bad).unwrap_err().starts_with("--drain-delay: "));
            assert!(run_duration(bad).unwrap_err().starts_with("--duration: "));
            assert!(listen_timeout(bad).unwrap_err().starts_with("--timeout: "));
        }
        assert_eq!(listen_timeout("0"), Ok(0.0));
    }
}
