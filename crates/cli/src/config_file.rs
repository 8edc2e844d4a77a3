//! `--config FILE`: a JSON object read through the command's own flag definitions. The parsed
//! flags are turned into a JSON object (every flag's snake_case name with its value, defaults
//! included), the file's keys replace those values, and the result is read back into the same
//! type with serde. So the file knows exactly the flags the command has, under the same names,
//! with no second list to keep in step; an unknown key or a wrong type fails naming the key.

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::path::Path;

/// `args` with the values of the JSON object in `path` put over them.
pub fn overlay<T: Serialize + DeserializeOwned>(args: &T, path: &Path) -> Result<T> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("--config {shown}"))?;
    let file: Value =
        serde_json::from_str(&text).with_context(|| format!("--config {shown}: not valid JSON"))?;
    let Value::Object(file) = file else {
        bail!("--config {shown}: expected a JSON object of flag names and values");
    };
    let Value::Object(base) = serde_json::to_value(args)? else {
        bail!("--config {shown}: the flags do not form a JSON object");
    };
    for key in file.keys() {
        if !base.contains_key(key) {
            bail!(
                "--config {shown}: unknown key {key:?} (keys are this command's flag names in \
                 snake_case, e.g. worker_urls)"
            );
        }
    }
    let merged = merge(base.clone(), &file);
    serde_json::from_value(Value::Object(merged)).map_err(|e| {
        // serde's message does not say which key; find it by trying each alone.
        let key = file.iter().find(|(k, v)| {
            let mut one = base.clone();
            one.insert((*k).clone(), (*v).clone());
            serde_json::from_value::<T>(Value::Object(one)).is_err()
        });
        match key {
            Some((k, v)) => anyhow!("--config {shown}: {k}: unexpected value {v}: {e}"),
            None => anyhow!("--config {shown}: {e}"),
        }
    })
}

fn merge(mut base: Map<String, Value>, file: &Map<String, Value>) -> Map<String, Value> {
    for (k, v) in file {
        base.insert(k.clone(), v.clone());
    }
    base
}
