//! What one worker serves, read from what it publishes: `/server_info` (SGLang's
//! `served_model_name`, `model_path`, `lora_paths`, `max_loaded_loras`, and loadlink's
//! `served_model_names`, `loaded_loras`, `lora_load_time_s`), `/v1/models` (vLLM lists its
//! adapters there, each with the base model as `parent`) and `/get_model_info` / `/model_info`.
//!
//! The parsers are pure and bounded: a worker is a peer like any other, so it may name at most
//! [`MAX_NAMES`] base names and [`MAX_ADAPTERS`] adapters of at most [`MAX_NAME_BYTES`] each; beyond
//! that its answer is refused with the reason (shown in `/workers`), never truncated silently.

use loadlink_wire::kv_namespace::LoraRef;
use serde_json::{Map, Value};
use std::sync::Arc;

/// Base names (served names and model paths) one worker may publish.
pub const MAX_NAMES: usize = 16;
/// Adapters one worker may publish.
pub const MAX_ADAPTERS: usize = 1024;
/// Bytes in one name or path.
pub const MAX_NAME_BYTES: usize = 1024;
/// `/v1/models` entries kept per worker for the fleet's listing.
pub const MAX_ENTRIES: usize = MAX_NAMES + MAX_ADAPTERS;

/// One LoRA adapter a worker can serve.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    pub name: Arc<str>,
    /// Where it was loaded from, when published (its SGLang `lora_id` derives from it).
    pub path: Option<Arc<str>>,
    /// Its namespace (name and SGLang's id), when the id is known or derivable.
    pub lora: Option<LoraRef>,
}

/// What one worker serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServedModels {
    /// Names a request may use for its base model: the served names (the primary first), then the
    /// model path. Empty: the worker did not say.
    pub names: Vec<Arc<str>>,
    pub adapters: Vec<Adapter>,
    /// How many adapters it keeps loaded at once (SGLang `--max-loaded-loras`).
    pub max_loaded_loras: Option<u32>,
    /// Seconds it takes to load an adapter, when it says (loadlink engine).
    pub lora_load_time_s: Option<f64>,
    /// The adapters loaded now, per DP rank, least recently used first (loadlink engine).
    pub loaded: Option<Vec<Vec<Arc<str>>>>,
    /// Its `/v1/models` entries, for the fleet's listing.
    pub entries: Vec<Value>,
}

impl ServedModels {
    /// The primary name (what `/v1/models` lists it as), if any.
    pub fn primary(&self) -> Option<&Arc<str>> {
        self.names.first()
    }

    /// Whether `name` names its base model.
    pub fn serves(&self, name: &str) -> bool {
        self.names.iter().any(|n| &**n == name)
    }

    /// Its adapter called `name` (or loaded from the path `name`).
    pub fn adapter(&self, name: &str) -> Option<&Adapter> {
        self.adapters.iter().find(|a| &*a.name == name).or_else(|| {
            self.adapters
                .iter()
                .find(|a| a.path.as_deref() == Some(name))
        })
    }

    /// Whether it said anything about its models.
    pub fn is_known(&self) -> bool {
        !self.names.is_empty()
    }

    fn add_name(&mut self, name: &str) -> Result<(), String> {
        checked(name, "model name")?;
        if !self.serves(name) {
            if self.names.len() == MAX_NAMES {
                return Err(format!(
                    "more than {MAX_NAMES} model names: refused (a worker serves a few)"
                ));
            }
            self.names.push(Arc::from(name));
        }
        Ok(())
    }

    fn add_adapter(
        &mut self,
        name: &str,
        path: Option<&str>,
        id: Option<&str>,
    ) -> Result<(), String> {
        checked(name, "adapter name")?;
        if let Some(p) = path {
            checked(p, "adapter path")?;
        }
        if self.adapters.iter().any(|a| &*a.name == name) {
            return Ok(());
        }
        if self.adapters.len() == MAX_ADAPTERS {
            return Err(format!("more than {MAX_ADAPTERS} adapters: refused"));
        }
        let lora = match (id, path) {
            (Some(id), _) if id.len() == 32 => Some(LoraRef {
                name: name.to_string(),
                id: id.to_string(),
            }),
            (_, Some(p)) => Some(LoraRef::from_path(name, p)),
            _ => None,
        };
        self.adapters.push(Adapter {
            name: Arc::from(name),
            path: path.map(Arc::from),
            lora,
        });
        Ok(())
    }

    /// Reads a `/server_info` body (SGLang's and loadlink's keys; others are ignored).
    pub fn read_server_info(&mut self, body: &[u8]) -> Result<(), String> {
        let m = object(body, "/server_info")?;
        for key in ["served_model_name", "served_model_names", "model_path"] {
            for name in strings(m.get(key), key)? {
                self.add_name(&name)?;
            }
        }
        match m.get("lora_paths") {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => {
                for (name, path) in o {
                    let path = path
                        .as_str()
                        .ok_or("lora_paths: expected name: path strings")?;
                    self.add_adapter(name, Some(path), None)?;
                }
            }
            Some(Value::Array(list)) => {
                for item in list {
                    let (name, path, id) = lora_item(item)?;
                    self.add_adapter(&name, path.as_deref(), id.as_deref())?;
                }
            }
            Some(_) => return Err("lora_paths: expected a list or an object".into()),
        }
        if let Some(n) = m.get("max_loaded_loras").filter(|v| !v.is_null()) {
            let n = n
                .as_u64()
                .ok_or("max_loaded_loras: expected an integer ≥ 0")?;
            self.max_loaded_loras = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some(t) = m.get("lora_load_time_s").filter(|v| !v.is_null()) {
            let t = t.as_f64().filter(|t| t.is_finite() && *t >= 0.0);
            self.lora_load_time_s = Some(t.ok_or("lora_load_time_s: expected seconds ≥ 0")?);
        }
        if let Some(ranks) = m.get("loaded_loras").filter(|v| !v.is_null()) {
            let ranks = ranks
                .as_array()
                .ok_or("loaded_loras: expected a list per rank")?;
            if ranks.len() > crate::budget::Budgets::default().max_ranks as usize {
                return Err("loaded_loras: more ranks than the router accepts".into());
            }
            let mut loaded = Vec::with_capacity(ranks.len());
            for r in ranks {
                let names = strings(Some(r), "loaded_loras")?;
                if names.len() > MAX_ADAPTERS {
                    return Err(format!("loaded_loras: more than {MAX_ADAPTERS} on a rank"));
                }
                loaded.push(names.iter().map(|n| Arc::from(n.as_str())).collect());
            }
            self.loaded = Some(loaded);
        }
        Ok(())
    }

    /// Reads a `/v1/models` body: entries without a `parent` name the base model (their `id`, and
    /// their `root` as an alias); entries with one are adapters of it (vLLM's form).
    pub fn read_models_list(&mut self, body: &[u8]) -> Result<(), String> {
        let m = object(body, "/v1/models")?;
        let data = m
            .get("data")
            .and_then(Value::as_array)
            .ok_or("/v1/models: expected {\"data\": [...]}")?;
        if data.len() > MAX_ENTRIES {
            return Err(format!(
                "/v1/models: more than {MAX_ENTRIES} entries: refused"
            ));
        }
        for e in data {
            let id = e
                .get("id")
                .and_then(Value::as_str)
                .ok_or("/v1/models: an entry without a string id")?;
            let root = e.get("root").and_then(Value::as_str);
            match e.get("parent").and_then(Value::as_str) {
                Some(_) => self.add_adapter(id, root, None)?,
                None => {
                    self.add_name(id)?;
                    if let Some(r) = root {
                        self.add_name(r)?;
                    }
                }
            }
            self.entries.push(e.clone());
        }
        Ok(())
    }

    /// Reads a `/get_model_info` or `/model_info` body (`model_path`, `served_model_name`).
    pub fn read_model_info(&mut self, body: &[u8]) -> Result<(), String> {
        let m = object(body, "/get_model_info")?;
        for key in ["served_model_name", "model_path"] {
            for name in strings(m.get(key), key)? {
                self.add_name(&name)?;
            }
        }
        Ok(())
    }
}

fn checked(s: &str, what: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{what} {:?}: expected 1 to {MAX_NAME_BYTES} bytes",
            s.chars().take(40).collect::<String>()
        ));
    }
    Ok(())
}

fn object(body: &[u8], what: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(format!("{what}: expected a JSON object")),
        Err(e) => Err(format!("{what}: not JSON ({e})")),
    }
}

/// A string or a list of strings (absent or null: none).
fn strings(v: Option<&Value>, key: &str) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= MAX_ADAPTERS => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{key}: expected strings"))
            })
            .collect(),
        Some(_) => Err(format!("{key}: expected a string or a list of strings")),
    }
}

/// One `lora_paths` item: `"name=path"`, `"path"`, `{lora_name, lora_path, lora_id}` or
/// `[lora_id, lora_name, lora_path, pinned]` (an array-like `LoRARef`).
fn lora_item(item: &Value) -> Result<(String, Option<String>, Option<String>), String> {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    match item {
        Value::String(spec) => Ok(match spec.split_once('=') {
            Some((n, p)) => (n.to_string(), Some(p.to_string()), None),
            None => (spec.clone(), Some(spec.clone()), None),
        }),
        Value::Object(o) => {
            let name = s(o.get("lora_name")).ok_or("lora_paths: an entry without lora_name")?;
            Ok((name, s(o.get("lora_path")), s(o.get("lora_id"))))
        }
        Value::Array(a) => {
            let name = s(a.get(1)).ok_or("lora_paths: an entry without a name")?;
            Ok((name, s(a.get(2)), s(a.first())))
        }
        _ => Err("lora_paths: expected strings, objects or arrays".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_server_info_names_the_model_and_its_adapters() {
        let mut s = ServedModels::default();
        let body = json!({"served_model_name": "alpha", "model_path": "/m/alpha",
            "lora_paths": ["a1=/l/a1", {"lora_name": "a2", "lora_path": "/l/a2"},
                ["0123456789abcdef0123456789abcdef", "a3", "/l/a3", false]],
            "max_loaded_loras": 4, "loaded_loras": [["a2"], []]});
        s.read_server_info(body.to_string().as_bytes()).unwrap();
        assert_eq!(s.names, [Arc::from("alpha"), Arc::from("/m/alpha")]);
        assert!(s.serves("/m/alpha") && !s.serves("beta"));
        let names: Vec<_> = s.adapters.iter().map(|a| &*a.name).collect();
        assert_eq!(names, ["a1", "a2", "a3"]);
        assert_eq!(
            s.adapter("a1").unwrap().lora,
            Some(LoraRef::from_path("a1", "/l/a1"))
        );
        assert_eq!(
            s.adapter("a3").unwrap().lora.as_ref().unwrap().id,
            "0123456789abcdef0123456789abcdef",
            "a published id wins"
        );
        assert_eq!(s.adapter("/l/a2").unwrap().name.as_ref(), "a2", "by path");
        assert_eq!(s.max_loaded_loras, Some(4));
        assert_eq!(s.loaded.as_ref().unwrap()[0], [Arc::from("a2")]);
    }

    #[test]
    fn vllm_lists_adapters_with_a_parent() {
        let mut s = ServedModels::default();
        let body = json!({"object": "list", "data": [
            {"id": "base", "root": "/m/base", "parent": null},
            {"id": "sql", "root": "/l/sql", "parent": "base"}]});
        s.read_models_list(body.to_string().as_bytes()).unwrap();
        assert!(s.serves("base") && s.serves("/m/base") && !s.serves("sql"));
        assert_eq!(s.adapter("sql").unwrap().path.as_deref(), Some("/l/sql"));
        assert_eq!(s.entries.len(), 2);
    }

    #[test]
    fn hostile_answers_are_refused_with_the_reason() {
        let mut s = ServedModels::default();
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("m{i}")).collect();
        let e = s
            .read_server_info(json!({ "served_model_names": many }).to_string().as_bytes())
            .unwrap_err();
        assert!(e.contains("more than 16 model names"), "{e}");
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let e = ServedModels::default()
            .read_model_info(json!({ "model_path": long }).to_string().as_bytes())
            .unwrap_err();
        assert!(
            e.contains("model name") && e.contains("1 to 1024 bytes"),
            "{e}"
        );
        let e = ServedModels::default()
            .read_server_info(br#"{"lora_paths": 3}"#)
            .unwrap_err();
        assert!(e.contains("lora_paths"), "{e}");
        let e = ServedModels::default()
            .read_models_list(b"[1]")
            .unwrap_err();
        assert!(e.contains("/v1/models"), "{e}");
    }
}
