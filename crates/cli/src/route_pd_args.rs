//! `loadlink route` flags for prefill–decode disaggregation, spelled as sglang-router spells them
//! (`--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL`), flattened into
//! `RouteArgs`. What they mean is in `loadlink_router::pd`; this file only reads and checks them.

use anyhow::{Result, bail};
use clap::Args;
use loadlink_router::RouterConfig;
use loadlink_router::fleet::validate_url;
use loadlink_router::pd::{BootstrapPort, PdConfig};
use loadlink_router::policy::Policy;
use serde::{Deserialize, Serialize};

fn policy_name(s: &str) -> Result<String, String> {
    Policy::parse(s).map(|_| s.to_string())
}

#[derive(Args, Serialize, Deserialize, Default)]
pub struct PdArgs {
    /// Prefill–decode disaggregation: each generation request (/generate, /v1/completions,
    /// /v1/chat/completions) goes to one prefill and one decode engine at once, with
    /// bootstrap_host/bootstrap_port/bootstrap_room added (SGLang's fields); the client gets the
    /// decode engine's answer. Workers come from --prefill/--decode, and from --worker-urls, DNS
    /// or POST /workers by their /server_info disaggregation_mode. See docs/router.md, "Prefill–decode disaggregation".
    #[arg(long = "pd", visible_alias = "pd-disaggregation")]
    #[serde(default)]
    pd: bool,
    /// A prefill engine, with its disaggregation bootstrap port (default: the one its
    /// /server_info advertises, else 8998) or `none` (send no bootstrap_port). Repeatable.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"])]
    #[serde(default)]
    prefill: Vec<String>,
    /// A decode engine. Repeatable.
    #[arg(long, value_name = "URL")]
    #[serde(default)]
    decode: Vec<String>,
    /// The prefill side's policy (any --policy value; default min_ttft: prefill backlog and
    /// cached prefix, per DP rank).
    #[arg(long, value_parser = policy_name)]
    prefill_policy: Option<String>,
    /// The decode side's policy (default decode_load: the engine's running and waiting requests,
    /// requests waiting for their KV transfer, and KV usage; this router's in-flight count while
    /// a worker's load is stale).
    #[arg(long, value_parser = policy_name)]
    decode_policy: Option<String>,
}

impl PdArgs {
    /// Sets `cfg.pd` (after the cache flags, whose knobs a side's policy of the same kind takes).
    /// `discovered`: some workers come from elsewhere (--worker-urls, a file, DNS, the admin API)
    /// and may bring either side.
    pub fn apply(&self, cfg: &mut RouterConfig, discovered: bool) -> Result<()> {
        if !self.pd {
            for (given, flag) in [
                (!self.prefill.is_empty(), "--prefill"),
                (!self.decode.is_empty(), "--decode"),
                (self.prefill_policy.is_some(), "--prefill-policy"),
                (self.decode_policy.is_some(), "--decode-policy"),
            ] {
                if given {
                    bail!("{flag} needs --pd (prefill–decode disaggregation)");
                }
            }
            return Ok(());
        }
        let mut pd = PdConfig::default();
        for entry in prefill_groups(&self.prefill) {
            pd.prefill.push(prefill_entry(entry)?);
        }
        for url in &self.decode {
            let url = validate_url(url).map_err(|e| anyhow::anyhow!("--decode {url:?}: {e}"))?;
            if pd.prefill.iter().any(|(u, _)| *u == url) {
                bail!("{url} is given as both --prefill and --decode: a worker has one role");
            }
            pd.decode.push(url);
        }
        let side = |name: &str, flag: &str, given: bool| -> Result<()> {
            if !given && !discovered {
                bail!(
                    "--pd: no {name} worker: give {flag} URL, or workers (--worker-urls, \
                     --worker-dns, --worker-urls-file, POST /workers with --admin-token) whose \
                     /server_info says disaggregation_mode {name}"
                );
            }
            Ok(())
        };
        side("prefill", "--prefill", !pd.prefill.is_empty())?;
        side("decode", "--decode", !pd.decode.is_empty())?;
        let tuned = |name: &Option<String>, default: Policy| -> Result<Policy> {
            let p = match name {
                Some(n) => Policy::parse(n).map_err(anyhow::Error::msg)?,
                None => default,
            };
            // The cache and pricing flags tuned --policy's value; a side of that kind takes them.
            Ok(
                match std::mem::discriminant(&p) == std::mem::discriminant(&cfg.policy) {
                    true => cfg.policy,
                    false => p,
                },
            )
        };
        pd.prefill_policy = tuned(&self.prefill_policy, pd.prefill_policy)?;
        pd.decode_policy = tuned(&self.decode_policy, pd.decode_policy)?;
        cfg.pd = Some(pd);
        Ok(())
    }
}

/// The `--prefill` values by occurrence: each URL (it has a `://`) with the port or `none` that
/// follows it, if any (clap hands them over as one list).
fn prefill_groups(values: &[String]) -> Vec<&[String]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for i in 1..=values.len() {
        if i == values.len() || values[i].contains("://") {
            groups.push(&values[start..i]);
            start = i;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// `--prefill URL [BOOTSTRAP_PORT|none]`.
fn prefill_entry(entry: &[String]) -> Result<(String, Option<BootstrapPort>)> {
    let Some(url) = entry.first() else {
        bail!("--prefill: expected URL [BOOTSTRAP_PORT|none]");
    };
    let url = validate_url(url).map_err(|e| anyhow::anyhow!("--prefill {url:?}: {e}"))?;
    let port = match entry.get(1).map(String::as_str) {
        None => None,
        Some("none") => Some(BootstrapPort::Omitted),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(BootstrapPort::Port(n)),
            _ => bail!("--prefill {url} {p:?}: expected a bootstrap port 1–65535 or none"),
        },
    };
    if entry.len() > 2 {
        bail!(
            "--prefill {url}: expected URL [BOOTSTRAP_PORT|none], got {} values",
            entry.len()
        );
    }
    Ok((url, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        pd: PdArgs,
    }

    fn parse(args: &[&str], discovered: bool) -> Result<RouterConfig> {
        let cli = Cli::try_parse_from(std::iter::once("route").chain(args.iter().copied()))?;
        let mut cfg = RouterConfig::default();
        cli.pd.apply(&mut cfg, discovered)?;
        Ok(cfg)
    }

    #[test]
    fn sglang_router_spelling_parses() {
        let cfg = parse(
            &[
                "--pd-disaggregation",
                "--prefill",
                "http://p1:30000",
                "9001",
                "--prefill",
                "http://p2:30000",
                "none",
                "--prefill",
                "http://p3:30000/",
                "--decode",
                "http://d1:30000",
                "--decode-policy",
                "least_load",
            ],
            false,
        )
        .unwrap();
        let pd = cfg.pd.unwrap();
        assert_eq!(
            pd.prefill,
            vec![
                (
                    "http://p1:30000".to_string(),
                    Some(BootstrapPort::Port(9001))
                ),
                ("http://p2:30000".to_string(), Some(BootstrapPort::Omitted)),
                ("http://p3:30000".to_string(), None),
            ]
        );
        assert_eq!(pd.decode, ["http://d1:30000"]);
        assert_eq!(
            (pd.prefill_policy.as_str(), pd.decode_policy.as_str()),
            ("min_ttft", "least_load")
        );
        let urls = RouterConfig {
            pd: Some(pd),
            ..Default::default()
        }
        .validated_worker_urls()
        .unwrap();
        assert_eq!(urls.len(), 4, "every PD worker is discovered: {urls:?}");
    }

    #[test]
    fn contradictions_are_named() {
        let err = |args: &[&str], discovered| parse(args, discovered).unwrap_err().to_string();
        assert!(err(&["--prefill", "http://p:1"], true).contains("--prefill needs --pd"));
        assert!(err(&["--decode-policy", "random"], true).contains("--decode-policy needs --pd"));
        assert!(err(&["--pd", "--prefill", "http://p:1"], false).contains("no decode worker"));
        assert!(err(&["--pd", "--decode", "http://d:1"], false).contains("no prefill worker"));
        let e = err(
            &[
                "--pd",
                "--prefill",
                "http://p:1",
                "99999",
                "--decode",
                "http://d:1",
            ],
            false,
        );
        assert!(
            e.contains("expected a bootstrap port 1–65535 or none"),
            "{e}"
        );
        let e = err(
            &["--pd", "--prefill", "http://x:1", "--decode", "http://x:1"],
            false,
        );
        assert!(e.contains("both --prefill and --decode"), "{e}");
        assert!(err(&["--pd", "--prefill", "ftp://p"], true).contains("--prefill"));
        // Discovery may bring both sides: --pd alone is fine then.
        let cfg = parse(&["--pd"], true).unwrap();
        assert_eq!(cfg.pd.unwrap().decode_policy.as_str(), "decode_load");
        assert!(parse(&[], false).unwrap().pd.is_none());
    }
}
