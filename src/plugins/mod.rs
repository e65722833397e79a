//! The exchange types plugins provide (crates under plugins/, each a Cargo
//! feature of warren, enabled by default), and the one federation needs
//! on an upstream (federation_upstream.rs), always compiled in.

pub mod federation_upstream;

use std::sync::Arc;

use warren_plugin_api::ExchangeType;

/// The plugin exchange types this build has.
#[derive(Default)]
pub struct Plugins {
    types: Vec<Arc<dyn ExchangeType>>,
}

impl Plugins {
    /// Every plugin compiled in.
    pub fn enabled() -> Plugins {
        let types: Vec<Arc<dyn ExchangeType>> = vec![
            Arc::new(federation_upstream::FederationUpstream),
            #[cfg(feature = "consistent-hash")]
            Arc::new(warren_consistent_hash::ConsistentHash),
            #[cfg(feature = "delayed-message")]
            Arc::new(warren_delayed_message::DelayedMessage),
        ];
        Plugins { types }
    }

    /// The names of the types they provide.
    pub fn names(&self) -> Vec<&'static str> {
        self.types.iter().map(|t| t.name()).collect()
    }

    /// The exchange type called `name`, if a plugin provides it.
    pub fn exchange_type(&self, name: &str) -> Option<Arc<dyn ExchangeType>> {
        self.types.iter().find(|t| t.name() == name).cloned()
    }
}
