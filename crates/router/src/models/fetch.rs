//! Asks one worker what it serves: its `/server_info` (already fetched by discovery, or fetched
//! here on a refresh), `/v1/models`, and, when neither named the model, `/get_model_info` then
//! `/model_info`. Each request is bounded in time and size ([`crate::peer_http`]); an endpoint the
//! worker does not have is skipped, and the worker is known by what the others said. An answer
//! beyond the budget is a refusal: the worker's models stay unknown and `/workers` says why.

use super::served::ServedModels;
use crate::budget::Refusal;
use crate::peer_http::{FetchBudget, HttpClient, bounded_get};

/// Why a worker's models are not known.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct ModelsError {
    pub reason: String,
    /// Set when the worker's answer was refused (counted as the worker's refusal).
    pub refusal: Option<Refusal>,
}

impl From<String> for ModelsError {
    fn from(reason: String) -> Self {
        ModelsError {
            reason,
            refusal: None,
        }
    }
}

/// The body of `GET {url}{path}` when it answers 2xx within `budget`; `Ok(None)` when it does not
/// answer well (no such route, an error, unreachable); `Err` when its answer was refused.
async fn get(
    client: &HttpClient,
    url: &str,
    path: &str,
    budget: FetchBudget,
) -> Result<Option<Vec<u8>>, ModelsError> {
    match bounded_get(client, &format!("{url}{path}"), budget).await {
        Ok(a) => Ok(a.status.is_success().then(|| a.body.to_vec())),
        Err(e) => match e.refusal() {
            Some(r) => Err(ModelsError {
                reason: format!("GET {path} refused ({}): {e}", r.as_str()),
                refusal: Some(r),
            }),
            None => Ok(None),
        },
    }
}

/// What `url` serves, from `server_info` (its `/server_info` body, when the caller has it) and the
/// worker's model routes; `Err` when an answer was refused or malformed (the reason), or when no
/// route named a model.
pub async fn served_models(
    client: &HttpClient,
    url: &str,
    server_info: Option<&[u8]>,
    budget: FetchBudget,
) -> Result<ServedModels, ModelsError> {
    let mut s = ServedModels::default();
    let fetched;
    let info = match server_info {
        Some(b) => Some(b),
        None => {
            fetched = get(client, url, "/server_info", budget).await?;
            fetched.as_deref()
        }
    };
    if let Some(b) = info {
        // A /server_info of another shape (not a JSON object) says nothing: not an error.
        match s.read_server_info(b) {
            Err(e) if !e.starts_with("/server_info:") => return Err(e.into()),
            _ => {}
        }
    }
    if let Some(b) = get(client, url, "/v1/models", budget).await? {
        s.read_models_list(&b)?;
    }
    for path in ["/get_model_info", "/model_info"] {
        if s.is_known() {
            break;
        }
        if let Some(b) = get(client, url, path, budget).await? {
            s.read_model_info(&b)?;
        }
    }
    if !s.is_known() {
        return Err(String::from(
            "the worker names no model (/server_info, /v1/models, /get_model_info, /model_info)",
        )
        .into());
    }
    Ok(s)
}
