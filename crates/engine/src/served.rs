//! What an engine serves: its model names and its LoRA adapters, and which of them a request
//! asks for.
//!
//! A router in front of many engines routes by model: it must learn what each engine serves
//! (`/v1/models`, `/server_info`) and an engine must say, by its counters, what it was asked for,
//! so a test can prove nothing was misrouted. The two engines name things differently:
//!
//! * **SGLang** serves one name (`--served-model-name`) and adapters given by `--lora-paths
//!   name=path`. A request picks an adapter by `model: "base:adapter"` (first) or by its
//!   `lora_path` (an adapter's name; loadlink also takes its path). The base model is never
//!   checked: an unknown `model` is served by the base model. An unknown adapter is a 400.
//! * **vLLM** serves one or more names (`--served-model-name a b`) and adapters given by
//!   `--lora-modules name=path`; a request picks an adapter by naming it as its `model`. Any other
//!   unknown `model` is a 404 `NotFoundError`.
//!
//! loadlink also lets the SGLang flavour take an adapter's bare name as `model` (vLLM's way), so a
//! router may address adapters one way whatever the engine.

use crate::flavor::Flavor;
use loadlink_wire::kv_namespace::LoraRef;
use serde_json::Value;

/// Adapters resident at once when adapters are given and `--max-loaded-loras` is not.
pub const DEFAULT_MAX_LOADED_LORAS: usize = 4;
/// Seconds an adapter load takes unless `--lora-load-time` says otherwise.
pub const DEFAULT_LORA_LOAD_TIME_S: f64 = 0.05;
/// The `model` label of requests naming a model or adapter the engine does not serve.
pub const UNSERVED: &str = "<unserved>";

/// An adapter as configured: `--lora-paths name=path` (SGLang) or `--lora-modules name=path`
/// (vLLM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSpec {
    pub name: String,
    pub path: String,
}

impl AdapterSpec {
    /// `name=path`, a bare `path` (named by itself, as SGLang does), or the JSON object either
    /// engine accepts (`{"lora_name", "lora_path"}` or `{"name", "path"}`).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        if spec.starts_with('{') {
            let v: Value = serde_json::from_str(spec)
                .map_err(|e| format!("adapter {spec:?}: not valid JSON: {e}"))?;
            let field = |keys: [&str; 2]| {
                keys.iter()
                    .find_map(|k| v.get(k).and_then(Value::as_str))
                    .map(str::to_string)
            };
            let name = field(["lora_name", "name"]);
            let path = field(["lora_path", "path"]);
            return match (name, path) {
                (Some(name), Some(path)) if !name.is_empty() && !path.is_empty() => {
                    Ok(AdapterSpec { name, path })
                }
                _ => Err(format!(
                    "adapter {spec}: expected {{\"lora_name\": NAME, \"lora_path\": PATH}}"
                )),
            };
        }
        let (name, path) = spec.split_once('=').unwrap_or((spec, spec));
        if name.is_empty() || path.is_empty() {
            return Err(format!(
                "adapter {spec:?}: expected NAME=PATH or PATH, both non-empty"
            ));
        }
        Ok(AdapterSpec {
            name: name.into(),
            path: path.into(),
        })
    }
}

/// The names and adapters an engine serves, checked once at start.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    /// Every served name, the primary first.
    pub(crate) names: Vec<String>,
    pub(crate) model_path: String,
    pub(crate) adapters: Vec<(AdapterSpec, LoraRef)>,
}

/// What a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Selection {
    /// The adapter's index, `None` for the base model.
    pub(crate) adapter: Option<u32>,
    /// Its `loadlink_engine_model_requests_total` series ([`Served::labels`]).
    pub(crate) label: usize,
}

/// Why a request's model or adapter cannot be served; its counter series is [`UNSERVED`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// SGLang: an adapter that is not loaded (400).
    UnknownAdapter(String),
    /// SGLang: an adapter asked of an engine without any (400).
    LoraOff(String),
    /// vLLM: a `model` that is neither a served name nor an adapter (404).
    UnknownModel(String),
}

impl Served {
    pub(crate) fn new(
        names: Vec<String>,
        model_path: Option<String>,
        adapters: Vec<AdapterSpec>,
    ) -> Result<Self, String> {
        let mut all: Vec<String> = Vec::new();
        for n in names {
            if n.is_empty() {
                return Err("--served-model-name: names must not be empty".into());
            }
            if !all.contains(&n) {
                all.push(n);
            }
        }
        if all.is_empty() {
            all.push("loadlink-sim".into());
        }
        let mut table = Vec::with_capacity(adapters.len());
        for a in adapters {
            if all.contains(&a.name)
                || table
                    .iter()
                    .any(|(t, _): &(AdapterSpec, _)| t.name == a.name)
            {
                return Err(format!(
                    "adapter {:?}: the name is already a served model or another adapter",
                    a.name
                ));
            }
            let lora = LoraRef::from_path(&a.name, &a.path);
            table.push((a, lora));
        }
        if u32::try_from(table.len()).is_err() {
            return Err("too many adapters".into());
        }
        Ok(Served {
            model_path: model_path.unwrap_or_else(|| all[0].clone()),
            names: all,
            adapters: table,
        })
    }

    pub(crate) fn primary(&self) -> &str {
        &self.names[0]
    }

    /// The `model` labels of the request counter: each served name, each adapter, [`UNSERVED`].
    pub(crate) fn labels(&self) -> impl Iterator<Item = &str> {
        let adapters = self.adapters.iter().map(|(a, _)| a.name.as_str());
        self.names
            .iter()
            .map(String::as_str)
            .chain(adapters)
            .chain([UNSERVED])
    }

    pub(crate) fn unserved_label(&self) -> usize {
        self.names.len() + self.adapters.len()
    }

    fn adapter_by_name(&self, name: &str) -> Option<u32> {
        let i = self.adapters.iter().position(|(a, _)| a.name == name)?;
        u32::try_from(i).ok()
    }

    fn adapter_by_name_or_path(&self, key: &str) -> Option<u32> {
        self.adapter_by_name(key).or_else(|| {
            let i = self.adapters.iter().position(|(a, _)| a.path == key)?;
            u32::try_from(i).ok()
        })
    }

    fn adapter(&self, i: u32) -> Selection {
        Selection {
            adapter: Some(i),
            label: self.names.len() + i as usize,
        }
    }

    /// The base model, counted under the served name `model` names (the primary when none).
    fn base(&self, model: Option<&str>) -> Selection {
        let label = match model {
            None => 0,
            Some(m) => self
                .names
                .iter()
                .position(|n| n == m)
                .unwrap_or(self.unserved_label()),
        };
        Selection {
            adapter: None,
            label,
        }
    }

    /// Which model or adapter a request with these `model` and `lora_path` fields runs on.
    pub(crate) fn select(
        &self,
        flavor: Flavor,
        model: Option<&str>,
        lora_path: Option<&str>,
    ) -> Result<Selection, Refusal> {
        match flavor {
            Flavor::Vllm => self.select_vllm(model),
            Flavor::Sglang => self.select_sglang(model, lora_path),
        }
    }

    fn select_vllm(&self, model: Option<&str>) -> Result<Selection, Refusal> {
        let Some(m) = model.filter(|m| !m.is_empty()) else {
            return Ok(self.base(None));
        };
        if self.names.iter().any(|n| n == m) {
            return Ok(self.base(Some(m)));
        }
        match self.adapter_by_name(m) {
            Some(i) => Ok(self.adapter(i)),
            None => Err(Refusal::UnknownModel(m.into())),
        }
    }

    fn select_sglang(
        &self,
        model: Option<&str>,
        lora_path: Option<&str>,
    ) -> Result<Selection, Refusal> {
        // `base:adapter` first (a served name containing ':' is taken whole), then `lora_path`.
        let from_model = model.and_then(|m| self.split_adapter(m));
        let wanted = from_model.or(lora_path.filter(|p| !p.is_empty()));
        if let Some(w) = wanted {
            if self.adapters.is_empty() {
                return Err(Refusal::LoraOff(w.into()));
            }
            return match self.adapter_by_name_or_path(w) {
                Some(i) => Ok(self.adapter(i)),
                None => Err(Refusal::UnknownAdapter(w.into())),
            };
        }
        // loadlink's leniency: an adapter's bare name as `model`, as vLLM takes it.
        if let Some(i) = model
            .filter(|m| !self.names.iter().any(|n| n == m))
            .and_then(|m| self.adapter_by_name(m))
        {
            return Ok(self.adapter(i));
        }
        Ok(self.base(model))
    }

    /// The adapter part of `base:adapter` (`None` without one, or for a served name itself).
    fn split_adapter<'a>(&self, model: &'a str) -> Option<&'a str> {
        if !model.contains(':') || self.names.iter().any(|n| n == model) {
            return None;
        }
        let rest = self
            .names
            .iter()
            .find_map(|n| model.strip_prefix(n.as_str())?.strip_prefix(':'))
            .or_else(|| model.split_once(':').map(|(_, a)| a))?;
        Some(rest.trim()).filter(|a| !a.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Served {
        let a = |s: &str| AdapterSpec::parse(s).unwrap();
        Served::new(
            vec!["base".into(), "alias".into()],
            None,
            vec![a("sql=/ad/sql"), a("/ad/chat")],
        )
        .unwrap()
    }

    #[test]
    fn specs_parse_in_every_spelling() {
        let p = |s| AdapterSpec::parse(s);
        assert_eq!(
            p("a=/x").unwrap(),
            AdapterSpec {
                name: "a".into(),
                path: "/x".into()
            }
        );
        assert_eq!(p("/x").unwrap().name, "/x");
        assert_eq!(
            p(r#"{"lora_name":"a","lora_path":"/x"}"#).unwrap().path,
            "/x"
        );
        assert_eq!(p(r#"{"name":"a","path":"/x"}"#).unwrap().name, "a");
        assert!(p("=x").unwrap_err().contains("NAME=PATH"));
        assert!(p(r#"{"name":"a"}"#).unwrap_err().contains("lora_path"));
        assert!(p("{oops").unwrap_err().contains("not valid JSON"));
    }

    #[test]
    fn sglang_selects_by_model_suffix_then_lora_path_and_serves_unknown_bases() {
        let s = served();
        let sel = |m: Option<&str>, l: Option<&str>| s.select(Flavor::Sglang, m, l);
        assert_eq!(sel(Some("base:sql"), None).unwrap().adapter, Some(0));
        assert_eq!(
            sel(Some("base:sql"), Some("/ad/chat")).unwrap().adapter,
            Some(0)
        );
        assert_eq!(sel(None, Some("/ad/chat")).unwrap().adapter, Some(1));
        assert_eq!(
            sel(None, Some("/ad/sql")).unwrap().adapter,
            Some(0),
            "by path"
        );
        assert_eq!(
            sel(Some("sql"), None).unwrap().adapter,
            Some(0),
            "vLLM-style name"
        );
        assert_eq!(sel(Some("other:sql"), None).unwrap().adapter, Some(0));
        let b = sel(Some("alias"), None).unwrap();
        assert_eq!((b.adapter, b.label), (None, 1));
        let u = sel(Some("nobody"), None).unwrap();
        assert_eq!((u.adapter, u.label), (None, s.unserved_label()));
        assert_eq!(sel(None, None).unwrap().label, 0);
        assert_eq!(
            sel(Some("base:nope"), None),
            Err(Refusal::UnknownAdapter("nope".into()))
        );
        let bare = Served::new(vec!["m".into()], None, vec![]).unwrap();
        assert_eq!(
            bare.select(Flavor::Sglang, None, Some("x")),
            Err(Refusal::LoraOff("x".into()))
        );
    }

    #[test]
    fn vllm_selects_by_model_only_and_refuses_the_unknown() {
        let s = served();
        let sel = |m: Option<&str>| s.select(Flavor::Vllm, m, Some("/ad/chat"));
        assert_eq!(sel(Some("sql")).unwrap().adapter, Some(0));
        assert_eq!(sel(Some("/ad/chat")).unwrap().adapter, Some(1));
        assert_eq!(
            sel(None).unwrap(),
            Selection {
                adapter: None,
                label: 0
            }
        );
        assert_eq!(sel(Some("alias")).unwrap().label, 1);
        assert_eq!(
            sel(Some("base:sql")),
            Err(Refusal::UnknownModel("base:sql".into()))
        );
    }

    #[test]
    fn names_must_be_distinct() {
        let dup = Served::new(
            vec!["m".into()],
            None,
            vec![AdapterSpec::parse("m=/x").unwrap()],
        );
        assert!(dup.unwrap_err().contains("already"));
        let s = served();
        let labels: Vec<&str> = s.labels().collect();
        assert_eq!(labels, ["base", "alias", "sql", "/ad/chat", UNSERVED]);
        assert_eq!(s.model_path, "base");
    }
}
