//! An exchange's or a queue's deduplication cache (dedup/): checked before
//! the owner is declared, opened empty for a new owner, and opened from
//! the store for one recovered at start or by a new leader.

use std::sync::Arc;

use amq_protocol::types::FieldTable;

use super::error::{Error, Result};
use super::VHost;
use crate::dedup::{args, Dedup, DedupArgs};
use crate::store::op::DEDUP_CACHES;

impl VHost {
    /// The cache settings `arguments` ask for (None: no cache), checked
    /// before anything is stored: 406 for arguments that are wrong, or for
    /// a `durable` cache a cluster's members cannot all replicate yet.
    pub(super) fn check_dedup(
        &self,
        arguments: &FieldTable,
        durable: bool,
        subject: &str,
    ) -> Result<Option<DedupArgs>> {
        args::validate(arguments, subject).map_err(Error::precondition_failed)?;
        let Some(settings) = args::of(arguments) else {
            return Ok(None);
        };
        if durable && !self.dedup_replicated()? {
            return Err(Error::precondition_failed(format!(
                "cannot declare {subject} with x-message-deduplication: its cache needs \
                 cluster version {DEDUP_CACHES}; the cluster is below it until every member \
                 runs a build that applies it"
            )));
        }
        Ok(Some(settings))
    }

    /// A new owner's cache (empty), kept in the store under `owner` if
    /// given.
    pub(super) fn new_dedup(
        &self,
        settings: Option<DedupArgs>,
        owner: Option<Vec<u8>>,
    ) -> Result<Option<Arc<Dedup>>> {
        let Some(settings) = settings else {
            return Ok(None);
        };
        let durable = owner.map(|o| (o, Arc::clone(&self.store)));
        Ok(Some(Dedup::open(settings, durable, false)?))
    }

    /// A recovered durable owner's cache, with what the store holds of it.
    /// Definitions a build before deduplication stored are taken as they
    /// are: arguments it ignored and that are wrong now leave the owner
    /// without a cache, and a cluster below the version that replicates
    /// caches keeps it in memory only (both logged), rather than stop the
    /// start.
    pub(super) fn restore_dedup(
        &self,
        arguments: &FieldTable,
        owner: Vec<u8>,
        subject: &str,
    ) -> Result<Option<Arc<Dedup>>> {
        if let Err(why) = args::validate(arguments, subject) {
            tracing::warn!("{why}: it runs without deduplication");
            return Ok(None);
        }
        let Some(settings) = args::of(arguments) else {
            return Ok(None);
        };
        let durable = if self.dedup_replicated()? {
            Some((owner, Arc::clone(&self.store)))
        } else {
            tracing::warn!(
                "{subject}: its deduplication cache is kept in memory only until the cluster \
                 reaches version {DEDUP_CACHES} and it is recovered again"
            );
            None
        };
        Ok(Some(Dedup::open(settings, durable, true)?))
    }

    /// Whether a durable cache's entries can be written (`Op::Dedup`): a
    /// single node, or a cluster whose members all apply them.
    fn dedup_replicated(&self) -> Result<bool> {
        if !self.store.delivers_after_commit() {
            return Ok(true);
        }
        Ok(self.store.cluster_version()? >= DEDUP_CACHES)
    }
}
