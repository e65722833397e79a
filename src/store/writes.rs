//! The store's write API: each call builds one operation (op.rs) and
//! submits it to the journal. Nothing here writes sled; the applier does.

use super::op::{Applied, Op};
use super::{
    BindingDef, Error, ExchangeDef, GlobalParameterDef, ParameterDef, PermissionDef, QueueDef,
    Result, Store, TopicPermissionDef, UserDef, VhostDef,
};
use crate::message::Message;

impl Store {
    /// Records (or replaces) a user.
    pub fn put_user(&self, def: &UserDef) -> Result<()> {
        self.submit(&Op::PutUser(def)).map(drop)
    }
    /// Forgets a user and its permissions.
    pub fn delete_user(&self, name: &str) -> Result<()> {
        self.submit(&Op::DeleteUser { name }).map(drop)
    }
    /// Sets a user's permissions on a vhost.
    pub fn put_permission(&self, def: &PermissionDef) -> Result<()> {
        self.submit(&Op::PutPermission(def)).map(drop)
    }
    /// Clears a user's permissions on a vhost.
    pub fn delete_permission(&self, vhost: &str, user: &str) -> Result<()> {
        self.submit(&Op::DeletePermission { vhost, user }).map(drop)
    }
    /// Records that the default user was created.
    pub fn mark_users_seeded(&self) -> Result<()> {
        self.submit(&Op::UsersSeeded).map(drop)
    }
    /// Records (or updates) a vhost.
    pub fn put_vhost(&self, def: &VhostDef) -> Result<()> {
        self.submit(&Op::PutVhost(def)).map(drop)
    }
    /// Forgets a vhost and everything in it.
    pub fn delete_vhost(&self, name: &str) -> Result<()> {
        self.submit(&Op::DeleteVhost { name }).map(drop)
    }
    /// Sets a user's topic permissions on an exchange.
    pub fn put_topic_permission(&self, def: &TopicPermissionDef) -> Result<()> {
        self.submit(&Op::PutTopicPermission(def)).map(drop)
    }
    /// Clears a user's topic permissions on one exchange ("": all of them).
    pub fn delete_topic_permission(&self, vhost: &str, user: &str, exchange: &str) -> Result<()> {
        let op = Op::DeleteTopicPermission {
            vhost,
            user,
            exchange,
        };
        self.submit(&op).map(drop)
    }
    /// Sets a runtime parameter.
    pub fn put_parameter(&self, def: &ParameterDef) -> Result<()> {
        self.submit(&Op::PutParameter(def)).map(drop)
    }
    /// Clears a runtime parameter.
    pub fn delete_parameter(&self, vhost: &str, component: &str, name: &str) -> Result<()> {
        let op = Op::DeleteParameter {
            vhost,
            component,
            name,
        };
        self.submit(&op).map(drop)
    }
    /// Sets a global parameter.
    pub fn put_global_parameter(&self, def: &GlobalParameterDef) -> Result<()> {
        self.submit(&Op::PutGlobalParameter(def)).map(drop)
    }
    /// Clears a global parameter.
    pub fn delete_global_parameter(&self, name: &str) -> Result<()> {
        self.submit(&Op::DeleteGlobalParameter { name }).map(drop)
    }
    /// Records a durable exchange.
    pub fn put_exchange(&self, def: &ExchangeDef) -> Result<()> {
        self.submit(&Op::PutExchange(def)).map(drop)
    }
    /// Forgets an exchange.
    pub fn delete_exchange(&self, vhost: &str, name: &str) -> Result<()> {
        self.submit(&Op::DeleteExchange { vhost, name }).map(drop)
    }
    /// Records a durable queue (its `id` is ignored) and returns the id
    /// the store gave it: a new one, never reused.
    pub fn declare_queue(&self, def: &QueueDef) -> Result<u64> {
        // Id 0: the journal (or the applier) chooses.
        let def = &QueueDef {
            id: 0,
            ..def.clone()
        };
        match self.submit(&Op::DeclareQueue(def))? {
            Applied::Queue(id) => Ok(id),
            Applied::Done => Err(Error::Corrupt("queue declare gave no id".into())),
        }
    }
    /// Forgets a queue and deletes its messages.
    pub fn delete_queue(&self, vhost: &str, name: &str, id: u64) -> Result<()> {
        self.submit(&Op::DeleteQueue { vhost, name, id }).map(drop)
    }
    /// Records a binding.
    pub fn put_binding(&self, def: &BindingDef) -> Result<()> {
        self.submit(&Op::PutBinding(def)).map(drop)
    }
    /// Forgets a binding.
    pub fn delete_binding(&self, def: &BindingDef) -> Result<()> {
        self.submit(&Op::DeleteBinding(def)).map(drop)
    }
    /// Writes a message of a durable queue (durable after the next group
    /// commit) with its expiry deadline (0: none).
    pub fn put_message(&self, queue_id: u64, seq: u64, msg: &Message, deadline: u64) -> Result<()> {
        self.submit_put(queue_id, seq, msg, false, deadline)
    }
    /// Writes messages `first`, `first + 1`, ... of a durable queue, all
    /// stored at `time`, as `put_message` writes each (a stream's batch),
    /// as one operation: a MOVE with no source, one record in the message
    /// log. A cluster ships it as one operation too; its members write it
    /// at once, leaving the puts they hold back held (msglog
    /// `move_records`).
    pub fn put_batch(
        &self,
        queue_id: u64,
        first: u64,
        msgs: &[std::sync::Arc<Message>],
        time: u64,
    ) -> Result<()> {
        let moves: Vec<super::op::Moved<'_>> = (first..)
            .zip(msgs)
            .map(|(to_seq, msg)| super::op::Moved {
                from_seq: 0,
                to_seq,
                deadline: 0,
                time,
                message: msg,
            })
            .collect();
        self.move_messages(queue_id, queue_id, &moves, &[])
    }
    /// Writes a kept message (see `put_message`) whose body leaves memory
    /// now: readable at once, before it is committed (a journal that
    /// applies on commit stages it), and committed as `put_message` is.
    pub fn put_message_paged_out(
        &self,
        queue_id: u64,
        seq: u64,
        msg: &Message,
        deadline: u64,
    ) -> Result<()> {
        self.journal
            .submit_paged(&Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged: false,
                time: crate::util::record_ms(),
                message: msg,
            })
            .map(drop)
    }
    /// Writes a message paged out of memory: a transient one, or any of
    /// a non-durable queue (local.rs), is never committed for its own sake
    /// and is dropped at the next start.
    pub fn put_paged(&self, queue_id: u64, seq: u64, msg: &Message, deadline: u64) -> Result<()> {
        self.journal
            .submit_paged(&Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged: !msg.persistent() || super::local::is_local(queue_id),
                time: crate::util::record_ms(),
                message: msg,
            })
            .map(drop)
    }
    fn submit_put(
        &self,
        queue_id: u64,
        seq: u64,
        message: &Message,
        paged: bool,
        deadline: u64,
    ) -> Result<()> {
        self.submit(&Op::PutMessage {
            queue_id,
            seq,
            deadline,
            paged,
            time: crate::util::record_ms(),
            message,
        })
        .map(drop)
    }
    /// Removes an acked message.
    pub fn remove_message(&self, queue_id: u64, seq: u64) -> Result<()> {
        if super::local::is_local(queue_id) {
            return self.remove_local(queue_id, seq);
        }
        self.submit(&Op::RemoveMessage { queue_id, seq }).map(drop)
    }
    /// Moves messages of queue `from` to queue `to` atomically (see
    /// `Op::MoveMessages`).
    pub fn move_messages(
        &self,
        from: u64,
        to: u64,
        moves: &[super::op::Moved<'_>],
        removes: &[u64],
    ) -> Result<()> {
        self.submit(&Op::MoveMessages {
            from,
            to,
            moves,
            removes,
        })
        .map(drop)
    }
    /// Deletes every message of a queue.
    pub fn purge_messages(&self, queue_id: u64) -> Result<()> {
        self.purge_from(queue_id, 0)
    }
    /// Deletes the messages of a queue from sequence `from` on.
    pub fn purge_from(&self, queue_id: u64, from: u64) -> Result<()> {
        if super::local::is_local(queue_id) {
            return self.purge_local(queue_id, from);
        }
        self.submit(&Op::PurgeFrom { queue_id, from }).map(drop)
    }
    /// Holds `message` until `due` (ms since the epoch); `seq` tells apart
    /// messages due at the same ms.
    pub fn put_delayed(
        &self,
        due: u64,
        seq: u64,
        vhost: &str,
        delay_ms: u64,
        message: &Message,
    ) -> Result<()> {
        self.submit(&Op::Hold {
            due,
            seq,
            vhost,
            delay_ms,
            message,
        })
        .map(drop)
    }
    /// Forgets a held message by its key.
    pub fn remove_delayed(&self, key: &[u8]) -> Result<()> {
        self.submit(&Op::Unhold { key }).map(drop)
    }
}
