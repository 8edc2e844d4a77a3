//! `/v1/loads` rendering (PROTOCOL.md §7): the JSON document and the Prometheus text form, with
//! the `include` section filter. Pure: the caller supplies the snapshots and the time.

use crate::prom::{Exposition, MetricType};
use crate::sections::{FieldValue, Section, for_each_section};
use crate::snapshot::{LoadSnapshot, Scalar};
use serde_json::{Map, Value, json};

/// Valid `include` options, in the order error messages list them.
pub const VALID_SECTIONS: [&str; 7] = ["all", "core", "disagg", "lora", "memory", "queues", "spec"];

/// Which parts of each snapshot to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Include {
    pub core: bool,
    pub memory: bool,
    pub spec: bool,
    pub lora: bool,
    pub disagg: bool,
    pub queues: bool,
}

impl Include {
    /// Whether the section `/v1/loads` calls `short` (`memory`, `spec`, …) is included.
    pub fn wants(&self, short: &str) -> bool {
        match short {
            "memory" => self.memory,
            "spec" => self.spec,
            "lora" => self.lora,
            "disagg" => self.disagg,
            "queues" => self.queues,
            _ => false,
        }
    }

    pub const ALL: Include = Include {
        core: true,
        memory: true,
        spec: true,
        lora: true,
        disagg: true,
        queues: true,
    };

    /// Parses `include=a,b,...`; absent or empty means all. The core block is always rendered.
    pub fn parse(param: Option<&str>) -> Result<Self, String> {
        let Some(param) = param.map(str::trim).filter(|p| !p.is_empty()) else {
            return Ok(Include::ALL);
        };
        let mut inc = Include {
            core: true,
            memory: false,
            spec: false,
            lora: false,
            disagg: false,
            queues: false,
        };
        let mut bad = Vec::new();
        for part in param.split(',').map(str::trim) {
            match part {
                "all" => inc = Include::ALL,
                "core" => {}
                "memory" => inc.memory = true,
                "spec" => inc.spec = true,
                "lora" => inc.lora = true,
                "disagg" => inc.disagg = true,
                "queues" => inc.queues = true,
                other => bad.push(other.to_string()),
            }
        }
        if bad.is_empty() {
            Ok(inc)
        } else {
            Err(format!(
                "include: invalid section(s) {bad:?}; valid options: {}",
                VALID_SECTIONS.join(", ")
            ))
        }
    }
}

fn scalar_json(v: Scalar) -> Value {
    match v {
        Scalar::Int(i) => json!(i),
        Scalar::Float(f) => json!(f.unwrap_or(0.0)),
    }
}

/// One rendered section: (field name, include/prometheus name, its fields).
type RenderedSection<'a> = (
    &'static str,
    &'static str,
    Vec<(&'static str, FieldValue<'a>)>,
);

/// Every present and included section, in wire order.
fn sections(s: &LoadSnapshot, inc: Include) -> Vec<RenderedSection<'_>> {
    let mut out = Vec::new();
    macro_rules! render {
        ($field:ident: $ty:ty) => {
            if let Some(m) = &s.$field
                && inc.wants(<$ty as Section>::SHORT)
            {
                out.push((<$ty as Section>::KEY, <$ty as Section>::SHORT, m.fields()));
            }
        };
    }
    for_each_section!(render);
    out
}

/// One rank's dict, as SGLang's `LoadSnapshot.to_dict(include)` shapes it.
pub fn snapshot_dict(s: &LoadSnapshot, inc: Include) -> Value {
    let mut m = Map::new();
    for (name, v) in s.core_scalars() {
        m.insert(name.into(), scalar_json(v));
    }
    m.insert(
        "decode_moments".into(),
        s.decode_moments.as_ref().map_or(Value::Null, |d| json!(d)),
    );
    for (field, _, kv) in sections(s, inc) {
        m.insert(
            field.into(),
            Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_json()))
                    .collect(),
            ),
        );
    }
    Value::Object(m)
}

/// Metadata of the `/v1/loads` document.
pub struct LoadsMeta<'a> {
    /// ISO-8601 time of the response.
    pub timestamp: &'a str,
    pub version: &'a str,
    pub accelerator: &'a str,
    pub num_accelerators: u32,
}

/// The JSON document.
pub fn render_json(meta: &LoadsMeta<'_>, loads: &[LoadSnapshot], inc: Include) -> Value {
    json!({
        "timestamp": meta.timestamp,
        "version": meta.version,
        "accelerator": meta.accelerator,
        "num_accelerators": meta.num_accelerators,
        "loads": loads.iter().map(|s| snapshot_dict(s, inc)).collect::<Vec<_>>(),
    })
}

/// The Prometheus text form: `sglang_<field>{dp_rank="r"}`, sections as `sglang_<section>_<field>`
/// (speculative → spec, disaggregation → disagg). Strings and lists are not gauges and are skipped.
pub fn render_prometheus(loads: &[LoadSnapshot], inc: Include) -> String {
    // Gathered per metric first: the format wants each family's samples together, and the
    // snapshots come rank by rank.
    let mut series: Vec<(String, Vec<(i64, f64)>)> = Vec::new();
    let mut add =
        |name: String, rank: i64, v: f64| match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push((rank, v)),
            None => series.push((name, vec![(rank, v)])),
        };
    for s in loads {
        for (name, v) in s.core_scalars() {
            add(format!("sglang_{name}"), s.dp_rank, v.as_f64());
        }
        for (_, short, kv) in sections(s, inc) {
            for (k, v) in kv {
                if let Some(x) = v.as_f64() {
                    add(format!("sglang_{short}_{k}"), s.dp_rank, x);
                }
            }
        }
    }
    let mut page = Exposition::new();
    for (name, pts) in series {
        let mut fam = page.family(name, MetricType::Gauge, "Per-rank scheduler load");
        for (rank, v) in pts {
            fam.sample(&[("dp_rank", rank)], v);
        }
    }
    page.finish()
}

/// ISO-8601 UTC (`2026-11-30T09:40:44.123Z`) for a Unix time in seconds, without a clock read.
pub fn iso8601(unix_secs: f64) -> String {
    let ms = (unix_secs * 1000.0).round() as i64;
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

/// Builds a snapshot from a dict in `to_dict` form (the inverse of [`snapshot_dict`]).
///
/// A float key that is present counts as explicitly set (it will be written, even 0.0), matching
/// msgspec's rule; absent keys keep their defaults. Unknown keys are an error naming the key, so a
/// typo in a test corpus or a config is caught rather than silently dropped.
pub fn snapshot_from_dict(v: &Value) -> Result<LoadSnapshot, String> {
    let obj = v.as_object().ok_or("snapshot: expected a JSON object")?;
    let mut s = LoadSnapshot::default();
    let int = |k: &str, v: &Value| {
        v.as_i64()
            .ok_or_else(|| format!("{k}: expected an integer, got {v}"))
    };
    let float = |k: &str, v: &Value| {
        v.as_f64()
            .ok_or_else(|| format!("{k}: expected a number, got {v}"))
    };
    for (key, val) in obj {
        if val.is_null() {
            continue;
        }
        if let Some((name, slot)) = s.core_scalar_mut(key.as_bytes()) {
            match slot {
                crate::snapshot::ScalarMut::Int(x) => *x = int(name, val)?,
                crate::snapshot::ScalarMut::Float(x) => *x = Some(float(name, val)?),
            }
            continue;
        }
        macro_rules! parse_section {
            ($field:ident: $ty:ty) => {
                if key == <$ty as Section>::KEY {
                    s.$field = Some(<$ty as Section>::from_json(val)?);
                    continue;
                }
            };
        }
        for_each_section!(parse_section);
        match key.as_str() {
            "decode_moments" => {
                let a = val
                    .as_array()
                    .ok_or("decode_moments: expected a list of numbers")?;
                s.decode_moments = Some(
                    a.iter()
                        .map(|x| float("decode_moments", x))
                        .collect::<Result<_, _>>()?,
                );
            }
            other => return Err(format!("snapshot: unknown field {other:?}")),
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{QueueMetrics, SpeculativeMetrics};

    #[test]
    fn include_filter_and_errors() {
        assert_eq!(Include::parse(None).unwrap(), Include::ALL);
        let i = Include::parse(Some("core,spec")).unwrap();
        assert!(i.spec && !i.queues);
        let e = Include::parse(Some("all,bogus")).unwrap_err();
        assert!(
            e.contains("bogus") && e.contains("valid options: all, core"),
            "{e}"
        );
    }

    #[test]
    fn json_and_prometheus_shapes() {
        let s = LoadSnapshot {
            dp_rank: 1,
            num_waiting_reqs: 4,
            token_usage: Some(0.5),
            speculative: Some(SpeculativeMetrics {
                accept_length: 2.5,
                accept_rate: 0.7,
            }),
            queues: Some(QueueMetrics {
                waiting: 4,
                ..Default::default()
            }),
            ..Default::default()
        };
        let inc = Include::parse(Some("spec")).unwrap();
        let d = snapshot_dict(&s, inc);
        assert_eq!(d["num_waiting_reqs"], 4);
        assert_eq!(d["timestamp"], 0.0);
        assert_eq!(d["speculative"]["accept_length"], 2.5);
        assert!(d.get("queues").is_none());
        let p = render_prometheus(std::slice::from_ref(&s), Include::ALL);
        assert!(
            p.contains("sglang_num_waiting_reqs{dp_rank=\"1\"} 4\n"),
            "{p}"
        );
        assert!(p.contains("sglang_spec_accept_rate{dp_rank=\"1\"} 0.7\n"));
        assert!(p.contains("sglang_queues_waiting{dp_rank=\"1\"} 4\n"));
        assert_eq!(p.matches("# TYPE sglang_token_usage gauge").count(), 1);
        let two = [s.clone(), LoadSnapshot { dp_rank: 2, ..s }];
        let page = crate::prom::parse(&render_prometheus(&two, Include::ALL)).unwrap();
        assert_eq!(
            page.value("sglang_num_waiting_reqs", &[("dp_rank", "2")]),
            Some(4.0)
        );
        assert_eq!(page.samples("sglang_token_usage").count(), 2);
        assert_eq!(iso8601(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_796_031_644.5), "2026-11-30T09:40:44.500Z");
    }
}
