//! Definitions: the node's users, vhosts, permissions, policies,
//! parameters, exchanges, queues and bindings in RabbitMQ's JSON format,
//! exported (export.rs) and imported (import.rs: checked whole, then
//! applied, or refused whole), for the whole node or one vhost.

mod args;
mod export;
mod import;

pub use args::{from_json as args_from_json, to_json as args_json};
pub use export::export;
pub use import::{component_not_found, import, tags, Imported};

/// The RabbitMQ version whose definitions and API Warren speaks.
pub const RABBITMQ_VERSION: &str = "3.10.25";

/// Imports the definitions file at `path` (`--definitions`,
/// `load_definitions`) and waits until it is durable.
pub async fn load_file(
    broker: &crate::broker::Broker,
    path: &std::path::Path,
) -> Result<Imported, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let done = import(broker, &file, None).map_err(|e| format!("{}: {e}", path.display()))?;
    broker
        .store
        .sync()
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(done)
}
