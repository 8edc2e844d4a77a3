//! A request's bootstrap fields, as SGLang's request models carry them: `bootstrap_host`
//! (string), `bootstrap_port` (integer), `bootstrap_room` (integer in `[0, 2^63)`),
//! `disagg_prefill_dp_rank` (integer), and `rid`. Batched `/generate` carries lists; a list of
//! one is that one request, a longer list is a batch, which this engine does not take in PD mode
//! (a 400 naming the field).

use serde_json::{Map, Value};

/// The bootstrap fields of one request (each `None` when absent or null).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootstrapFields {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub room: Option<u64>,
    pub dp_rank: Option<i32>,
    /// The request's `rid`, when the client gave one (SGLang's error messages name it).
    pub rid: Option<String>,
}

impl BootstrapFields {
    /// Whether this is SGLang's fake bootstrap (health checks, warm-ups): no transfer.
    pub fn is_fake(&self) -> bool {
        self.host.as_deref() == Some(super::FAKE_BOOTSTRAP_HOST)
    }
}

/// The one value of `key`: itself, or the only element of a list (batched `/generate`).
fn one<'a>(m: &'a Map<String, Value>, key: &str) -> Result<Option<&'a Value>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 1 => Ok(Some(&a[0]).filter(|v| !v.is_null())),
        Some(Value::Array(a)) => Err(format!(
            "{key}: a list of {} values is a batch; in PD mode this engine takes one request per call",
            a.len()
        )),
        Some(v) => Ok(Some(v)),
    }
}

fn int(m: &Map<String, Value>, key: &str, max: u64) -> Result<Option<u64>, String> {
    match one(m, key)? {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(format!("{key}: expected an integer in 0..={max}, got {v}")),
        },
    }
}

/// Reads the bootstrap fields of a request body.
pub fn parse(m: &Map<String, Value>) -> Result<BootstrapFields, String> {
    let host = match one(m, "bootstrap_host")? {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(format!("bootstrap_host: expected a string, got {v}")),
    };
    let rid = match one(m, "rid")? {
        Some(Value::String(s)) => Some(s.chars().take(200).collect()),
        _ => None,
    };
    Ok(BootstrapFields {
        host,
        port: int(m, "bootstrap_port", u64::from(u16::MAX))?.map(|p| p as u16),
        room: int(m, "bootstrap_room", i64::MAX as u64)?,
        dp_rank: int(m, "disagg_prefill_dp_rank", i32::MAX as u64)?.map(|r| r as i32),
        rid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(body: &str) -> Result<BootstrapFields, String> {
        let v: Value = serde_json::from_str(body).unwrap();
        parse(v.as_object().unwrap())
    }

    #[test]
    fn fields_single_and_list_of_one() {
        let f = of(r#"{"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":9223372036854775807,"disagg_prefill_dp_rank":1,"rid":"r1"}"#).unwrap();
        assert_eq!(
            (
                f.host.as_deref(),
                f.port,
                f.room,
                f.dp_rank,
                f.rid.as_deref()
            ),
            (
                Some("10.0.0.1"),
                Some(8998),
                Some(i64::MAX as u64),
                Some(1),
                Some("r1")
            )
        );
        let f =
            of(r#"{"bootstrap_host":["2.2.2.2"],"bootstrap_port":[null],"bootstrap_room":[0]}"#)
                .unwrap();
        assert!(f.is_fake());
        assert_eq!((f.port, f.room), (None, Some(0)));
        assert_eq!(of("{}").unwrap(), BootstrapFields::default());
    }

    #[test]
    fn bad_fields_name_themselves() {
        let e = |b: &str| of(b).unwrap_err();
        assert!(e(r#"{"bootstrap_room":-1}"#).starts_with("bootstrap_room: expected an integer"));
        assert!(e(r#"{"bootstrap_room":9223372036854775808}"#).starts_with("bootstrap_room"));
        assert!(e(r#"{"bootstrap_port":70000}"#).starts_with("bootstrap_port"));
        assert!(e(r#"{"bootstrap_host":5}"#).starts_with("bootstrap_host: expected a string"));
        assert!(e(r#"{"bootstrap_room":[1,2]}"#).contains("is a batch"));
    }
}
