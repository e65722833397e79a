//! Opening an exchange's or a queue's deduplication cache at declare and
//! at start (dedup/).

use std::sync::Arc;

use amq_protocol::types::FieldTable;

use super::error::{Error, Result};
use super::VHost;
use crate::dedup::{args, Dedup};
use crate::store::op::DEDUP_CACHES;

impl VHost {
    /// The cache `arguments` ask for (None if they ask for none), kept in
    /// the store under `owner` if given (a durable exchange or queue);
    /// 406 for arguments that are wrong, or for a durable cache a
    /// cluster's members cannot all replicate yet.
    pub(super) fn open_dedup(
        &self,
        arguments: &FieldTable,
        owner: Option<Vec<u8>>,
        subject: &str,
    ) -> Result<Option<Arc<Dedup>>> {
        args::validate(arguments, subject).map_err(Error::precondition_failed)?;
        let Some(settings) = args::of(arguments) else {
            return Ok(None);
        };
        if owner.is_some() && self.store.delivers_after_commit() {
            let at = self.store.cluster_version()?;
            if at < DEDUP_CACHES {
                return Err(Error::precondition_failed(format!(
                    "cannot declare {subject} with x-message-deduplication: its cache needs \
                     cluster version {DEDUP_CACHES}; the cluster is at {at} until every member \
                     runs a build that applies it"
                )));
            }
        }
        let durable = owner.map(|o| (o, Arc::clone(&self.store)));
        Ok(Some(Dedup::open(settings, durable)?))
    }
}
