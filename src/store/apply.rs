//! The applier: the one place operations become writes, to sled's trees
//! and to the delivered-marks log. Whatever journal carries the stream
//! (journal.rs), state changes only here, so applying a stream anywhere
//! gives the same state.
//!
//! Definition operations run one at a time (a lock they alone take: they
//! are rare, and a queue's id must come from the counter as the last one
//! left it); the messages of deleted queues go outside it. Message operations run as they come, on the caller's thread:
//! operations on one queue are ordered by the queue's own lock, and those
//! on different queues touch different keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::delivered::DeliveredLog;
use super::msglog::MessageLog;
use super::op::{Applied, Op};
use super::shipped::Shipped;
use super::{
    access, cluster_version, dedup, definitions, delayed, messages, tenancy, tracked, Result,
};

/// The state operations change.
pub struct Applier {
    pub(super) defs: sled::Tree,
    /// Messages kept in sled (an older data dir's, moved to `log` at the
    /// first open; the tests' replicas).
    pub(super) msgs: sled::Tree,
    /// The node's messages (a single node's and a cluster member's).
    pub(super) log: Option<Arc<MessageLog>>,
    /// Set by every write outside `log` (sync.rs: `LogSync`).
    pub(super) dirty: Arc<AtomicBool>,
    pub(super) delayed: sled::Tree,
    pub(super) delivered: DeliveredLog,
    /// Message puts submitted and not applied yet, readable at once (a
    /// journal that applies on commit stages what leaves memory).
    pub(super) pending: sled::Tree,
    /// Puts shipped and not applied yet, in memory (shipped.rs); `pending`
    /// keeps the paged transient messages a leader never ships.
    pub(super) shipped: Shipped,
    /// Whether anything was staged since `clear_pending`.
    staged: AtomicBool,
    /// Whether `pending` may hold anything (else no sled read or write).
    staged_sled: AtomicBool,
    /// Held messages released and not unheld in the applied state yet:
    /// the scheduler must not release them again meanwhile.
    pub(super) unholding: Mutex<std::collections::HashSet<Vec<u8>>>,
    /// Serializes definition operations.
    defs_lock: Mutex<()>,
    /// Bumped by every definition operation.
    defs_version: AtomicU64,
}

impl Applier {
    /// The applier of `db`'s trees and `delivered`, with messages in
    /// sled (tests).
    pub fn new(db: &sled::Db, delivered: DeliveredLog) -> Result<Applier> {
        Self::with_log(db, delivered, None)
    }

    /// The applier of a node: messages in `log`.
    pub fn with_log(
        db: &sled::Db,
        delivered: DeliveredLog,
        log: Option<Arc<MessageLog>>,
    ) -> Result<Applier> {
        Ok(Applier {
            defs: db.open_tree("definitions")?,
            msgs: db.open_tree("messages")?,
            log,
            dirty: Arc::new(AtomicBool::new(true)),
            delayed: db.open_tree("delayed")?,
            pending: db.open_tree("pending")?,
            shipped: Shipped::default(),
            staged: AtomicBool::new(false),
            // What a stop left there is cleared by the next term's start.
            staged_sled: AtomicBool::new(true),
            unholding: Mutex::default(),
            delivered,
            defs_lock: Mutex::new(()),
            defs_version: AtomicU64::new(0),
        })
    }

    /// Applies one operation.
    pub fn apply(&self, op: &Op<'_>) -> Result<Applied> {
        if let Some(log) = &self.log {
            return self.apply_to_log(log, op);
        }
        match *op {
            Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged,
                time,
                message,
            } => {
                messages::put(&self.msgs, queue_id, seq, message, paged, deadline, time)?;
                self.unstage(queue_id, seq)?;
            }
            Op::RemoveMessage { queue_id, seq } => {
                self.msgs.remove(messages::message_key(queue_id, seq))?;
                self.unstage(queue_id, seq)?;
            }
            // What a purge leaves staged was staged after it was submitted
            // (`unstage_from` took the rest then): it stays.
            Op::PurgeFrom { queue_id, from } => messages::purge_from(&self.msgs, queue_id, from)?,
            Op::MoveMessages {
                from,
                to,
                moves,
                removes,
            } => {
                messages::move_records(&self.msgs, from, to, moves, removes)?;
                for m in moves {
                    self.unstage(to, m.to_seq)?;
                }
            }
            _ => return self.apply_other(op),
        }
        Ok(Applied::Done)
    }

    /// Applies one operation with the messages in the log (a single node,
    /// a cluster member); a put leaves what staged it (a cluster's leader).
    fn apply_to_log(&self, log: &MessageLog, op: &Op<'_>) -> Result<Applied> {
        match *op {
            Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged,
                time,
                message,
            } => {
                log.put(queue_id, seq, message, paged, deadline, time)?;
                self.unstage(queue_id, seq)?;
            }
            Op::RemoveMessage { queue_id, seq } => {
                log.remove(queue_id, seq)?;
                self.unstage(queue_id, seq)?;
            }
            // As in sled (`apply`): what is staged after the purge stays.
            Op::PurgeFrom { queue_id, from } => log.purge_from(queue_id, from)?,
            Op::MoveMessages {
                from,
                to,
                moves,
                removes,
            } => {
                log.move_records(from, to, moves, removes)?;
                for m in moves {
                    self.unstage(to, m.to_seq)?;
                }
            }
            Op::Unhold { .. } => {
                // A released copy reaches the OS before its hold's removal
                // can (a kill then duplicates it, never loses it).
                log.flush()?;
                return self.apply_other(op);
            }
            _ => return self.apply_other(op),
        }
        Ok(Applied::Done)
    }

    /// Applies an operation on something other than a queue's messages.
    fn apply_other(&self, op: &Op<'_>) -> Result<Applied> {
        let applied = self.apply_other_now(op);
        // After the write, and before the caller takes its ticket: the
        // sync that takes the flag covers the write (sync.rs: LogSync).
        self.dirty.store(true, Ordering::SeqCst);
        applied
    }

    fn apply_other_now(&self, op: &Op<'_>) -> Result<Applied> {
        match *op {
            Op::Hold {
                due,
                seq,
                vhost,
                delay_ms,
                message,
            } => delayed::hold(&self.delayed, due, seq, vhost, delay_ms, message)?,
            Op::Unhold { key } => {
                delayed::unhold(&self.delayed, key)?;
                if self.is_staging() {
                    self.unholding.lock().remove(key);
                }
            }
            Op::Reserve { queue_id, upto } => self.delivered.reserve(queue_id, upto)?,
            // Not a definition: no version bump, no definitions lock.
            Op::TrackOffset {
                queue_id,
                name,
                offset,
            } => tracked::track(&self.defs, queue_id, name, offset)?,
            Op::Dedup {
                owner,
                slot,
                seq,
                expires,
                key,
            } => dedup::put(
                &self.defs,
                owner,
                &dedup::Entry {
                    slot,
                    seq,
                    expires,
                    key,
                },
            )?,
            _ => return self.apply_definition(op),
        }
        Ok(Applied::Done)
    }

    fn apply_definition(&self, op: &Op<'_>) -> Result<Applied> {
        // A vhost's messages go before its definitions. A snapshot built
        // while entries are applied dumps the definitions, then the
        // messages (raft/snapshot.rs); replaying this operation over one
        // that missed the queues finds no queue ids to purge, so it must
        // miss their messages too: it does, since they went first.
        if let Op::DeleteVhost { name } = *op {
            for id in tenancy::queue_ids(&self.defs, name)? {
                self.forget_queue(id)?;
            }
        }
        let one_at_a_time = self.defs_lock.lock();
        let tree = &self.defs;
        let mut applied = Applied::Done;
        let mut gone_queues = Vec::new();
        match *op {
            Op::PutVhost(def) => tenancy::put_vhost(tree, def)?,
            Op::DeleteVhost { name } => {
                gone_queues = tenancy::delete_vhost(tree, name)?;
                dedup::forget_vhost(tree, name)?;
            }
            Op::PutTopicPermission(def) => access::put_topic_permission(tree, def)?,
            Op::DeleteTopicPermission {
                vhost,
                user,
                exchange,
            } => access::delete_topic_permission(tree, vhost, user, exchange)?,
            Op::PutParameter(def) => tenancy::put_parameter(tree, def)?,
            Op::DeleteParameter {
                vhost,
                component,
                name,
            } => tenancy::delete_parameter(tree, vhost, component, name)?,
            Op::PutGlobalParameter(def) => tenancy::put_global(tree, def)?,
            Op::DeleteGlobalParameter { name } => tenancy::delete_global(tree, name)?,
            Op::PutExchange(def) => definitions::put_exchange(tree, def)?,
            Op::DeleteExchange { vhost, name } => {
                definitions::delete_exchange(tree, vhost, name)?;
                dedup::forget_exchange(tree, vhost, name)?;
            }
            Op::DeclareQueue(def) => {
                applied = Applied::Queue(definitions::declare_queue(tree, def)?)
            }
            Op::DeleteQueue { vhost, name, id } => {
                definitions::delete_queue(tree, vhost, name)?;
                gone_queues.push(id);
            }
            Op::PutBinding(def) => definitions::put_binding(tree, def)?,
            Op::DeleteBinding(def) => definitions::delete_binding(tree, def)?,
            Op::PutUser(def) => access::put_user(tree, def)?,
            Op::DeleteUser { name } => access::delete_user(tree, name)?,
            Op::PutPermission(def) => access::put_permission(tree, def)?,
            Op::DeletePermission { vhost, user } => access::delete_permission(tree, vhost, user)?,
            Op::UsersSeeded => access::mark_seeded(tree)?,
            Op::ClusterVersion { level } => cluster_version::raise(tree, level)?,
            _ => {}
        }
        self.defs_version.fetch_add(1, Ordering::SeqCst);
        drop(one_at_a_time);
        // A deleted queue's messages go outside the lock: a large queue
        // must not hold up every other definition change. (A vhost's
        // queues are empty by now, but for what a single node's journal
        // put or declared meanwhile.)
        fail::fail_point!("apply-definitions-gone");
        for id in gone_queues {
            self.forget_queue(id)?;
        }
        if let Op::DeleteVhost { name } = *op {
            delayed::forget_vhost(&self.delayed, name)?;
        }
        Ok(applied)
    }

    /// Deletes queue `id`'s messages and delivered marks.
    fn forget_queue(&self, id: u64) -> Result<()> {
        self.delivered.forget(id);
        tracked::forget(&self.defs, id)?;
        dedup::forget_queue(&self.defs, id)?;
        match &self.log {
            Some(log) => log.purge_from(id, 0)?,
            None => messages::purge_from(&self.msgs, id, 0)?,
        }
        if self.is_staging() {
            self.shipped.purge_from(id, 0);
            if self.staged_sled.load(Ordering::Acquire) {
                messages::purge_from(&self.pending, id, 0)?;
            }
        }
        Ok(())
    }

    /// Stages a message put (`Op::PutMessage`, and the puts of an
    /// `Op::MoveMessages`; anything else is ignored): readable by the
    /// store's reads until it is applied or purged.
    pub fn stage(&self, op: &Op<'_>) -> Result<()> {
        match *op {
            Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged,
                time,
                message,
            } => {
                self.staged.store(true, Ordering::Release);
                if paged {
                    // Never shipped: it lives until acked.
                    self.staged_sled.store(true, Ordering::Release);
                    messages::put(&self.pending, queue_id, seq, message, paged, deadline, time)?;
                } else {
                    self.shipped.put(queue_id, seq, message);
                }
            }
            // What moved is readable in its new queue at once (it may page
            // it out before the operation is applied).
            Op::MoveMessages { to, moves, .. } => {
                self.staged.store(true, Ordering::Release);
                for m in moves {
                    self.shipped.put(to, m.to_seq, m.message);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Forgets everything staged (a new term begins, or this node stopped
    /// serving): what was not committed never happened.
    pub fn clear_pending(&self) -> Result<()> {
        self.pending.clear()?;
        self.shipped.clear();
        self.unholding.lock().clear();
        self.staged.store(false, Ordering::Release);
        self.staged_sled.store(false, Ordering::Release);
        Ok(())
    }

    /// Drops staged puts of queue `queue_id` from `from` on (a purge or a
    /// delete submitted now: what is staged later stays).
    pub fn unstage_from(&self, queue_id: u64, from: u64) -> Result<()> {
        if self.is_staging() {
            self.shipped.purge_from(queue_id, from);
            if self.staged_sled.load(Ordering::Acquire) {
                messages::purge_from(&self.pending, queue_id, from)?;
            }
        }
        Ok(())
    }

    /// Marks a held message released until its unhold is applied.
    pub fn unholding(&self, key: &[u8]) {
        self.staged.store(true, Ordering::Release);
        self.unholding.lock().insert(key.to_vec());
    }

    /// Whether staged puts may exist.
    pub(super) fn is_staging(&self) -> bool {
        self.staged.load(Ordering::Acquire)
    }

    /// Drops staged put `seq` of queue `queue_id` (applied, or a local
    /// queue's paged message acked).
    pub(super) fn unstage(&self, queue_id: u64, seq: u64) -> Result<()> {
        if self.is_staging() {
            self.shipped.remove(queue_id, seq);
            if self.staged_sled.load(Ordering::Acquire) {
                self.pending.remove(messages::message_key(queue_id, seq))?;
            }
        }
        Ok(())
    }

    /// Whether sled's `pending` tree may hold staged puts.
    pub(super) fn is_staging_in_sled(&self) -> bool {
        self.staged_sled.load(Ordering::Acquire)
    }

    /// The last durable queue id given (a journal that chooses ids).
    pub fn last_queue_id(&self) -> Result<u64> {
        definitions::last_queue_id(&self.defs)
    }

    /// The cluster version the applied state records.
    pub fn cluster_version(&self) -> Result<u32> {
        cluster_version::read(&self.defs)
    }

    /// Counts definition operations applied.
    pub fn defs_version(&self) -> u64 {
        self.defs_version.load(Ordering::SeqCst)
    }
}
