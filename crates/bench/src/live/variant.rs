//! What a live run compares: loadlink's own router under any `--policy` / `--load-signal` pair
//! (passed to `loadlink route` as strings, so a policy added to the router is a variant by name,
//! with no change here), optionally with further `loadlink route` flags after the pair (such as
//! `--fleet-pricing blind`, so one policy's settings compare on the same trace), or an external router started from a command template, such as the real
//! `sglang-router` from PyPI. Both run on the same engines and the same trace.
//!
//! An external template is whitespace-separated words (no shell, no quoting) with placeholders:
//! * `{workers}`: the engines' base URLs; a word that is exactly `{workers}` becomes one argument
//!   per engine, elsewhere they are joined with spaces;
//! * `{pd_workers}` (a word of its own): on a PD fleet, `--prefill URL BOOTSTRAP_PORT` per prefill
//!   engine and `--decode URL` per decode engine, as sglang-router, SMG and `loadlink route --pd`
//!   spell them; either it or `{workers}` is required;
//! * `{port}`: the HTTP port the router must listen on (chosen free by the runner);
//! * `{metrics_port}`: a second free port, for routers that open a metrics listener of their own
//!   (sglang-router's `--prometheus-port` defaults to 29000, which two replicas would share);
//! * `{replica}`: the replica's index, 0-based.
//!
//! `{port}` and `{workers}` are required; any other `{name}` is refused, so a typo fails at parse
//! time, not half-way through a run (the shell's `${…}` and JSON braces pass through).

use super::pd::PdWorkers;
use crate::scenario::VARIANTS;

/// One variant of a live run.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveVariant {
    /// `loadlink route --policy POLICY --load-signal SIGNAL`; on a PD fleet, `POLICY` is the
    /// prefill policy and `decode` the decode policy (`None`: the router's default).
    Loadlink {
        policy: String,
        signal: String,
        decode: Option<String>,
        /// Further `loadlink route` arguments, as given after the pair (whitespace-split).
        extra: Vec<String>,
    },
    External(ExternalRouter),
}

impl LiveVariant {
    /// `policy / signal` for loadlink (as the simulation labels its rows; `+ decode` and any
    /// extra flags after it), the given name for an external router.
    pub fn label(&self) -> String {
        match self {
            LiveVariant::Loadlink {
                policy,
                signal,
                decode,
                extra,
            } => {
                let mut l = format!("{policy} / {signal}");
                if let Some(d) = decode {
                    l.push_str(&format!(" + {d}"));
                }
                for w in extra {
                    l.push(' ');
                    l.push_str(w);
                }
                l
            }
            LiveVariant::External(e) => e.name.clone(),
        }
    }

    /// `POLICY/SIGNAL`, e.g. `power_of_two/backlog`, or on a PD fleet `POLICY/SIGNAL+DECODE`
    /// (`min_ttft/backlog+round_robin`), then optionally more `loadlink route` flags after a
    /// space (`min_ttft/backlog --fleet-pricing blind`); the strings are the router's to judge.
    pub fn parse_loadlink(spec: &str) -> Result<Self, String> {
        let expected = || {
            format!(
                "{spec:?}: expected POLICY/SIGNAL or POLICY/SIGNAL+DECODE_POLICY, then optionally \
                 route flags, e.g. power_of_two/backlog or min_ttft/backlog --fleet-pricing blind"
            )
        };
        let mut words = spec.split_whitespace();
        let spec = words.next().ok_or_else(expected)?;
        let extra: Vec<String> = words.map(String::from).collect();
        if extra.first().is_some_and(|w| !w.starts_with("--")) {
            return Err(expected());
        }
        let (routed, decode) = match spec.split_once('+') {
            Some((r, d)) if !d.trim().is_empty() && !d.contains(['/', '+']) => {
                (r, Some(d.trim().to_string()))
            }
            Some(_) => return Err(expected()),
            None => (spec, None),
        };
        let (policy, signal) = routed.split_once('/').ok_or_else(expected)?;
        let (policy, signal) = (policy.trim(), signal.trim());
        if policy.is_empty() || signal.is_empty() || signal.contains('/') {
            return Err(expected());
        }
        Ok(LiveVariant::Loadlink {
            policy: policy.into(),
            signal: signal.into(),
            decode,
            extra,
        })
    }

    /// The variants a live run compares when none is named: the simulation's list.
    pub fn defaults() -> Vec<Self> {
        VARIANTS
            .iter()
            .map(|(p, s)| LiveVariant::Loadlink {
                policy: p.as_str().into(),
                signal: s.as_str().into(),
                decode: None,
                extra: Vec::new(),
            })
            .collect()
    }

    pub fn is_external(&self) -> bool {
        matches!(self, LiveVariant::External(_))
    }
}

/// An external router: a name for the reports and a command template.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalRouter {
    pub name: String,
    words: Vec<String>,
}

const PLACEHOLDERS: [&str; 5] = [
    "{workers}",
    "{pd_workers}",
    "{port}",
    "{metrics_port}",
    "{replica}",
];

/// Where one replica of an external router is to run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slot {
    pub port: u16,
    pub metrics_port: u16,
    pub replica: usize,
}

impl ExternalRouter {
    /// `NAME=COMMAND TEMPLATE`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, command) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected NAME=COMMAND"))?;
        let name = name.trim();
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(format!(
                "{spec:?}: the name must be one word before the '='"
            ));
        }
        let words: Vec<String> = command.split_whitespace().map(String::from).collect();
        if words.is_empty() {
            return Err(format!("{name}: the command is empty"));
        }
        if !words.iter().any(|w| w.contains("{port}")) {
            return Err(format!("{name}: the command has no {{port}}"));
        }
        if !words
            .iter()
            .any(|w| w.contains("{workers}") || w == "{pd_workers}")
        {
            return Err(format!(
                "{name}: the command has no {{workers}} (or {{pd_workers}})"
            ));
        }
        if let Some(w) = words.iter().find(|w| unknown_placeholder(w)) {
            return Err(format!(
                "{name}: unknown placeholder in {w:?}; known: {}",
                PLACEHOLDERS.join(" ")
            ));
        }
        Ok(ExternalRouter {
            name: name.into(),
            words,
        })
    }

    /// Whether the template names the fleet's PD sides (`{pd_workers}`).
    pub fn wants_pd(&self) -> bool {
        self.words.iter().any(|w| w == "{pd_workers}")
    }

    /// The program and its arguments for one replica; `pd` expands `{pd_workers}` (to nothing on
    /// a fleet that is not disaggregated; the runner refuses that pairing first).
    pub fn command(&self, workers: &[String], pd: Option<&PdWorkers>, slot: Slot) -> Vec<String> {
        let mut out = Vec::new();
        for w in &self.words {
            if w == "{workers}" {
                out.extend(workers.iter().cloned());
                continue;
            }
            if w == "{pd_workers}" {
                out.extend(pd.map(PdWorkers::args).unwrap_or_default());
                continue;
            }
            out.push(
                w.replace("{workers}", &workers.join(" "))
                    .replace("{port}", &slot.port.to_string())
                    .replace("{metrics_port}", &slot.metrics_port.to_string())
                    .replace("{replica}", &slot.replica.to_string()),
            );
        }
        out
    }

    /// The template as given (for the results JSON).
    pub fn template(&self) -> String {
        self.words.join(" ")
    }
}

/// Whether `word` holds a `{name}` (letters, digits, `_`) that is not one of [`PLACEHOLDERS`].
/// A `${…}` is the shell's and other braces (JSON) are not placeholders, so both pass.
fn unknown_placeholder(word: &str) -> bool {
    let bytes = word.as_bytes();
    let mut i = 0;
    while let Some(open) = word[i..].find('{').map(|o| o + i) {
        i = open + 1;
        if open > 0 && bytes[open - 1] == b'$' {
            continue;
        }
        let Some(close) = word[i..].find('}').map(|c| c + i) else {
            break;
        };
        let name = &word[open + 1..close];
        let is_name =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if is_name && !PLACEHOLDERS.contains(&&word[open..=close]) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls() -> Vec<String> {
        vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()]
    }

    #[test]
    fn a_template_expands_every_placeholder() {
        let e = ExternalRouter::parse(
            "sg=python -m r --worker-urls {workers} --port {port} --prometheus-port {metrics_port} --log r{replica}.log --all={workers}",
        )
        .unwrap();
        assert_eq!(e.name, "sg");
        let slot = Slot {
            port: 9,
            metrics_port: 10,
            replica: 1,
        };
        assert_eq!(
            e.command(&urls(), None, slot),
            [
                "python",
                "-m",
                "r",
                "--worker-urls",
                "http://127.0.0.1:1",
                "http://127.0.0.1:2",
                "--port",
                "9",
                "--prometheus-port",
                "10",
                "--log",
                "r1.log",
                "--all=http://127.0.0.1:1 http://127.0.0.1:2",
            ]
        );
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        let err = |s: &str| ExternalRouter::parse(s).unwrap_err();
        assert!(err("no equals sign").contains("NAME=COMMAND"));
        assert!(err("=r --port {port} {workers}").contains("name"));
        assert!(err("a b=r --port {port} {workers}").contains("name"));
        assert!(err("x=   ").contains("empty"));
        assert!(err("x=r {workers}").contains("{port}"));
        assert!(err("x=r --port {port}").contains("{workers}"));
        let pd =
            ExternalRouter::parse("x=r --pd-disaggregation {pd_workers} --port {port}").unwrap();
        assert!(pd.wants_pd());
        let sides = PdWorkers {
            prefill: vec![("http://p".into(), 8998)],
            decode: vec!["http://d".into()],
        };
        let slot = Slot {
            port: 9,
            metrics_port: 10,
            replica: 0,
        };
        assert_eq!(
            pd.command(&urls(), Some(&sides), slot).join(" "),
            "r --pd-disaggregation --prefill http://p 8998 --decode http://d --port 9"
        );
        assert!(err("x=r --port {prot} {port} {workers}").contains("unknown placeholder"));
        // The shell's ${…} and JSON braces are not placeholders.
        let ok = ExternalRouter::parse(r#"x=sh -c echo${IFS}{port} {"a":1} {workers}"#);
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn loadlink_variants_carry_any_policy_string() {
        let v = LiveVariant::parse_loadlink("cache_aware/backlog").unwrap();
        assert_eq!(v.label(), "cache_aware / backlog");
        assert!(!v.is_external());
        assert!(LiveVariant::parse_loadlink("power_of_two").is_err());
        assert!(LiveVariant::parse_loadlink("/backlog").is_err());
        assert!(LiveVariant::parse_loadlink("a/b/c").is_err());
        let pd = LiveVariant::parse_loadlink("min_ttft/backlog+round_robin").unwrap();
        assert_eq!(pd.label(), "min_ttft / backlog + round_robin");
        assert!(LiveVariant::parse_loadlink("min_ttft/backlog+").is_err());
        assert!(LiveVariant::parse_loadlink("min_ttft/backlog+a/b").is_err());
        let blind = LiveVariant::parse_loadlink("min_ttft/backlog --fleet-pricing blind").unwrap();
        assert_eq!(blind.label(), "min_ttft / backlog --fleet-pricing blind");
        let LiveVariant::Loadlink { extra, policy, .. } = &blind else {
            panic!("{blind:?}")
        };
        assert_eq!(
            (policy.as_str(), extra.as_slice()),
            (
                "min_ttft",
                &["--fleet-pricing".to_string(), "blind".into()][..]
            )
        );
        // What follows the pair must be flags, so a stray word is not taken for one.
        assert!(LiveVariant::parse_loadlink("min_ttft/backlog blind").is_err());
        assert!(LiveVariant::parse_loadlink("  ").is_err());
        let d = LiveVariant::defaults();
        assert_eq!(d.len(), VARIANTS.len());
        assert_eq!(d[0].label(), "round_robin / inflight");
    }
}
