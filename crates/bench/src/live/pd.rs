//! The live run on a prefill–decode disaggregated fleet (`bench live --scenario s6`): the first
//! engines start as prefill engines (`--disaggregation-mode prefill`, each binding a bootstrap port
//! of its own, read back from `/server_info`), the others as decode engines; the routers are told
//! both sides as sglang-router spells them (`--prefill URL PORT`, `--decode URL`), which
//! `loadlink route --pd`, SMG and sglang-router all take.
//!
//! A direct (router-bypassing) request is paired by the client itself, as the simulator's direct
//! traffic is: one prefill and one decode engine picked uniformly, the same body with
//! `bootstrap_host`, `bootstrap_port` and a fresh `bootstrap_room` sent to both at once; the
//! decode engine's stream is what is measured.

use loadlink_router::policy::mix;

/// The disaggregated fleet's sides, as the routers are told them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PdWorkers {
    /// Each prefill engine's URL and bootstrap port.
    pub prefill: Vec<(String, u16)>,
    /// Each decode engine's URL.
    pub decode: Vec<String>,
}

impl PdWorkers {
    /// `--prefill URL PORT … --decode URL …`: the sides as arguments.
    pub fn args(&self) -> Vec<String> {
        let prefill = self
            .prefill
            .iter()
            .flat_map(|(u, p)| ["--prefill".into(), u.clone(), p.to_string()]);
        let decode = self
            .decode
            .iter()
            .flat_map(|u| ["--decode".to_string(), u.clone()]);
        prefill.chain(decode).collect()
    }

    /// The prefill engines' URLs (whose admissions the cache hit rate counts).
    pub fn prefill_urls(&self) -> Vec<String> {
        self.prefill.iter().map(|(u, _)| u.clone()).collect()
    }

    /// The (prefill, decode) pair and room of direct request `i`: uniform on either side, a room
    /// in `[0, 2^63)` of its own.
    pub fn direct_pair(&self, i: usize) -> Option<(&(String, u16), &String, u64)> {
        let h = mix(i as u64 ^ 0xd1ec7);
        let p = self
            .prefill
            .get((h % self.prefill.len().max(1) as u64) as usize)?;
        let d = self
            .decode
            .get(((h >> 32) % self.decode.len().max(1) as u64) as usize)?;
        Some((p, d, mix(h ^ 0x500e) >> 1))
    }
}

/// A PD engine's own flags: prefill for the first `prefill` engines (a bootstrap port picked free
/// and advertised), decode for the others.
pub(super) fn engine_args(e: usize, prefill: usize) -> Vec<String> {
    if e < prefill {
        ["--disaggregation-mode", "prefill"]
            .into_iter()
            .chain(["--disaggregation-bootstrap-port", "0"])
            .map(String::from)
            .collect()
    } else {
        ["--disaggregation-mode", "decode"]
            .into_iter()
            .map(String::from)
            .collect()
    }
}

/// A prefill engine's bootstrap port, from its `/server_info`.
pub(super) async fn bootstrap_port(c: &reqwest::Client, url: &str) -> Result<u16, String> {
    let info = super::get_json(c, &format!("{url}/server_info"))
        .await
        .ok_or_else(|| format!("{url}/server_info did not answer JSON"))?;
    let port = &info["disaggregation_bootstrap_port"];
    port.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| {
            format!(
                "{url}/server_info: disaggregation_bootstrap_port is {port}, expected a port \
                 (is the engine in prefill mode?)"
            )
        })
}

/// `body` with the bootstrap fields of a request whose prefill runs at `prefill` (URL, bootstrap
/// port) in room `room`.
pub(super) fn with_bootstrap(
    mut body: serde_json::Value,
    prefill: &(String, u16),
    room: u64,
) -> serde_json::Value {
    let host = prefill
        .0
        .split_once("://")
        .map_or(prefill.0.as_str(), |(_, rest)| rest);
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    body["bootstrap_host"] = host.into();
    body["bootstrap_port"] = prefill.1.into();
    body["bootstrap_room"] = room.into();
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet() -> PdWorkers {
        PdWorkers {
            prefill: vec![
                ("http://127.0.0.1:7001".into(), 9001),
                ("http://127.0.0.1:7002".into(), 9002),
            ],
            decode: vec![
                "http://127.0.0.1:7003".into(),
                "http://127.0.0.1:7004".into(),
            ],
        }
    }

    #[test]
    fn the_sides_are_spelled_as_sglang_router_takes_them() {
        assert_eq!(
            fleet().args().join(" "),
            "--prefill http://127.0.0.1:7001 9001 --prefill http://127.0.0.1:7002 9002 \
             --decode http://127.0.0.1:7003 --decode http://127.0.0.1:7004"
        );
        assert_eq!(engine_args(0, 2)[1], "prefill");
        assert_eq!(engine_args(2, 2), ["--disaggregation-mode", "decode"]);
    }

    #[test]
    fn direct_pairs_cover_both_sides_with_rooms_below_two_to_the_63() {
        let f = fleet();
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            let (p, d, room) = f.direct_pair(i).unwrap();
            assert!(room < 1 << 63);
            seen.insert((p.1, d.clone()));
        }
        assert_eq!(seen.len(), 4, "every pair is used: {seen:?}");
        let b = with_bootstrap(serde_json::json!({"max_tokens": 3}), &f.prefill[1], 42);
        assert_eq!(b["bootstrap_host"], "127.0.0.1");
        assert_eq!(b["bootstrap_port"], 9002);
        assert_eq!(b["bootstrap_room"], 42);
        assert_eq!(b["max_tokens"], 3);
        assert!(PdWorkers::default().direct_pair(0).is_none());
    }

    #[test]
    fn loadlink_route_is_told_both_sides_and_both_policies_on_a_pd_fleet() {
        use super::super::routers::route_args;
        let f = fleet();
        let pd = route_args(
            5,
            (&[], Some(&f)),
            ("min_ttft", "backlog", Some("round_robin")),
        );
        let pd = pd.join(" ");
        assert!(
            pd.starts_with("route --port 5 --pd --prefill http://127.0.0.1:7001 9001"),
            "{pd}"
        );
        assert!(pd.contains("--decode http://127.0.0.1:7004"), "{pd}");
        assert!(
            pd.ends_with(
                "--prefill-policy min_ttft --load-signal backlog --decode-policy round_robin"
            ),
            "{pd}"
        );
        assert!(
            !pd.contains("--worker-urls") && !pd.contains("--policy min_ttft"),
            "{pd}"
        );
        let urls = ["http://a".to_string(), "http://b".to_string()];
        let plain = route_args(5, (&urls, None), ("min_ttft", "backlog", None)).join(" ");
        assert_eq!(
            plain,
            "route --port 5 --policy min_ttft --load-signal backlog --worker-urls http://a http://b"
        );
    }
}
