//! Models and LoRA adapters behind one router: what each worker serves ([`served`], read at
//! discovery and re-read every `--model-refresh-interval` by [`refresh`]), the fleet's table of
//! which candidates serve which model ([`table`], built with the roster), what a request asks for
//! ([`asked`]), and the fleet's `/v1/models` ([`union`]). How names and adapters are matched is in
//! `docs/router.md`, "Models and adapters".

pub mod answer;
pub mod asked;
pub mod fetch;
pub mod metrics;
pub mod refresh;
pub mod registry;
pub mod served;
pub mod table;
pub mod union;

pub use asked::Asked;
pub use served::{Adapter, ServedModels};
pub use table::{ModelStats, ModelTable, Resolved, SetId, Unresolved};
pub use union::union;
