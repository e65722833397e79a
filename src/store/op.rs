//! Operations: every change to durable state as a value. Writers build an
//! `Op` and submit it to the store's journal (journal.rs), which puts it in
//! the ordered stream that the group commit makes durable; the applier
//! (apply.rs) is the only code that turns an operation into sled writes.
//!
//! An operation borrows what it carries (a message, a definition), so
//! making one allocates nothing. It carries every value its applier needs
//! (sequence numbers, deadlines, due times): applying the same stream on
//! another node gives the same state. The one value the applier makes up,
//! a durable queue's id, comes from the applied state (a counter advanced
//! by each `DeclareQueue`), so it agrees wherever the stream is applied.
//!
//! `encode` and `decode` give the operation's versioned byte form, for a
//! journal that ships operations elsewhere (the mirroring issue's Raft
//! log): a version octet, a tag octet, then the fields. Messages travel in
//! their store record form (messages.rs), definitions as their JSON.

use bytes::{BufMut, Bytes, BytesMut};

use super::access::{PermissionDef, TopicPermissionDef, UserDef};
use super::definitions::{BindingDef, ExchangeDef, QueueDef};
use super::messages::{append_record, decode_record, encode_record, Decoded};
use super::tenancy::{GlobalParameterDef, ParameterDef, VhostDef};
use super::{Error, Result};
use crate::message::Message;
use crate::wire::FieldReader;

/// The version of the encoding `encode` writes.
pub const VERSION: u8 = 1;

/// The newest cluster version this build applies. A replicated journal
/// writes an operation only once the cluster version committed in the log
/// (`Op::ClusterVersion`) is at least the operation's `level()`, and the
/// leader raises that version only when every member said it applies it:
/// a member running an older build never meets an operation it cannot
/// apply. Version 1 is every operation of the builds before cluster
/// versions existed (tags 1 to 26); 2 adds `ClusterVersion` itself; 3
/// lets message records carry the time they were stored (messages.rs
/// `HAS_TIME`: `PutMessage` and `MoveMessages` with a time, and the
/// snapshots' messages); 4 adds no operation, but a member of a build
/// at 4 takes appends whose batches travel raw (cluster/rpc.rs
/// `APPEND_RAW`); 5 adds `TrackOffset`; 6 adds `Dedup`; 7 answers
/// `STREAM_END` (no new operation).
pub const LEVEL: u32 = 7;

/// The cluster version from which a stream reader's offset is tracked.
pub const TRACKED_OFFSETS: u32 = 5;

/// The cluster version from which deduplication caches are replicated.
pub const DEDUP_CACHES: u32 = 6;

/// The cluster version from which message records carry their time.
pub const TIMED_RECORDS: u32 = 3;

/// One change to durable state.
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// Records (or updates) a vhost.
    PutVhost(&'a VhostDef),
    /// Forgets a vhost and everything recorded in it (exchanges, queues
    /// and their messages, bindings, permissions, parameters).
    DeleteVhost { name: &'a str },
    /// Records (or replaces) a durable exchange.
    PutExchange(&'a ExchangeDef),
    /// Forgets a durable exchange.
    DeleteExchange { vhost: &'a str, name: &'a str },
    /// Records a durable queue. With `id` 0 the applier gives it the next
    /// id from the applied state, and `Applied::Queue` says which; a
    /// journal that applies on commit chooses the id and ships it.
    DeclareQueue(&'a QueueDef),
    /// Forgets a durable queue, its messages and its delivered mark.
    DeleteQueue {
        vhost: &'a str,
        name: &'a str,
        id: u64,
    },
    /// Records a durable binding.
    PutBinding(&'a BindingDef),
    /// Forgets a binding.
    DeleteBinding(&'a BindingDef),
    /// Stores message `seq` of queue `queue_id`; `paged` marks a transient
    /// message paged out of memory (dropped at the next start); `deadline`
    /// is its expiry and `time` when it was stored, ms since the epoch (0:
    /// none).
    PutMessage {
        queue_id: u64,
        seq: u64,
        deadline: u64,
        paged: bool,
        time: u64,
        message: &'a Message,
    },
    /// Removes one message.
    RemoveMessage { queue_id: u64, seq: u64 },
    /// Removes a queue's messages from sequence `from` on.
    PurgeFrom { queue_id: u64, from: u64 },
    /// Moves messages of queue `from` to queue `to` in one atomic write:
    /// each of `moves` is put in `to` (removed from `from` too when it
    /// has a record there), each seq of `removes` is removed from `from`
    /// (messages that go to a queue that does not keep them). The op
    /// carries the messages, so it does not depend on what `from` still
    /// holds when it is applied.
    MoveMessages {
        from: u64,
        to: u64,
        moves: &'a [Moved<'a>],
        removes: &'a [u64],
    },
    /// Holds a message of a delayed exchange of `vhost` until `due` (ms
    /// since the epoch); `seq` tells apart messages due at the same ms.
    Hold {
        due: u64,
        seq: u64,
        vhost: &'a str,
        delay_ms: u64,
        message: &'a Message,
    },
    /// Forgets a held message (released, or unreadable) by its key (due
    /// time and sequence; whatever the record has, if it is corrupt).
    Unhold { key: &'a [u8] },
    /// Records (or replaces) a user.
    PutUser(&'a UserDef),
    /// Forgets a user and its permissions.
    DeleteUser { name: &'a str },
    /// Sets a user's permissions on a vhost.
    PutPermission(&'a PermissionDef),
    /// Clears a user's permissions on a vhost.
    DeletePermission { vhost: &'a str, user: &'a str },
    /// The default user was created: never again, even with no users left.
    UsersSeeded,
    /// Sets a user's topic permissions on an exchange.
    PutTopicPermission(&'a TopicPermissionDef),
    /// Clears a user's topic permissions on `exchange` of `vhost` (all of
    /// them on the vhost when `exchange` is empty).
    DeleteTopicPermission {
        vhost: &'a str,
        user: &'a str,
        exchange: &'a str,
    },
    /// Sets a vhost's runtime parameter (a policy, its limits, ...).
    PutParameter(&'a ParameterDef),
    /// Clears a runtime parameter.
    DeleteParameter {
        vhost: &'a str,
        component: &'a str,
        name: &'a str,
    },
    /// Sets a global parameter.
    PutGlobalParameter(&'a GlobalParameterDef),
    /// Clears a global parameter.
    DeleteGlobalParameter { name: &'a str },
    /// Every message of queue `queue_id` up to `upto` may have been
    /// delivered (a delivered-mark reservation, see delivered.rs).
    Reserve { queue_id: u64, upto: u64 },
    /// Every member applies operations up to cluster version `level` (see
    /// `LEVEL`); the applied version never goes down.
    ClusterVersion { level: u32 },
    /// Stream `queue_id`'s reader `name` resumes at `offset` (server-side
    /// offset tracking, queue/stream/tracking.rs).
    TrackOffset {
        queue_id: u64,
        name: &'a str,
        offset: u64,
    },
    /// Deduplication cache `owner` (an exchange's or a durable queue's,
    /// dedup/) holds `key` in ring slot `slot`: entry number `seq`,
    /// expiring at `expires` (ms since the epoch, 0: never).
    Dedup {
        owner: &'a [u8],
        slot: u64,
        seq: u64,
        expires: u64,
        key: [u8; 16],
    },
}

impl Op<'_> {
    /// The cluster version a member needs to apply this operation.
    pub fn level(&self) -> u32 {
        match self {
            Op::ClusterVersion { .. } => 2,
            Op::TrackOffset { .. } => TRACKED_OFFSETS,
            Op::Dedup { .. } => DEDUP_CACHES,
            Op::PutMessage { time, .. } if *time != 0 => TIMED_RECORDS,
            Op::MoveMessages { moves, .. } if moves.iter().any(|m| m.time != 0) => TIMED_RECORDS,
            _ => 1,
        }
    }
}

impl<'a> Op<'a> {
    /// The same without the messages' times, for a cluster whose version
    /// is below `TIMED_RECORDS`; `moves` holds a move's copies.
    pub fn untimed<'b>(&self, moves: &'b mut Vec<Moved<'a>>) -> Op<'b>
    where
        'a: 'b,
    {
        match *self {
            Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged,
                message,
                ..
            } => Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged,
                time: 0,
                message,
            },
            Op::MoveMessages {
                from,
                to,
                moves: all,
                removes,
            } => {
                *moves = all.iter().map(|m| Moved { time: 0, ..*m }).collect();
                Op::MoveMessages {
                    from,
                    to,
                    moves,
                    removes,
                }
            }
            other => other,
        }
    }
}

/// One message of `Op::MoveMessages`.
#[derive(Debug, Clone, Copy)]
pub struct Moved<'a> {
    /// Its sequence in the source, 0 if the source has no record of it.
    pub from_seq: u64,
    /// Its sequence in the destination.
    pub to_seq: u64,
    /// Its expiry deadline there (ms since the epoch; 0: none).
    pub deadline: u64,
    /// When it was stored there (ms since the epoch; 0: not recorded).
    pub time: u64,
    pub message: &'a Message,
}

/// What applying an operation produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Nothing to report.
    Done,
    /// The id of the durable queue a `DeclareQueue` recorded.
    Queue(u64),
}

const PUT_VHOST: u8 = 1;
const PUT_EXCHANGE: u8 = 2;
const DELETE_EXCHANGE: u8 = 3;
const DECLARE_QUEUE: u8 = 4;
const DELETE_QUEUE: u8 = 5;
const PUT_BINDING: u8 = 6;
const DELETE_BINDING: u8 = 7;
const PUT_MESSAGE: u8 = 8;
const REMOVE_MESSAGE: u8 = 9;
const PURGE_FROM: u8 = 10;
const HOLD: u8 = 11;
const UNHOLD: u8 = 12;
const RESERVE: u8 = 13;
const PUT_USER: u8 = 14;
const DELETE_USER: u8 = 15;
const PUT_PERMISSION: u8 = 16;
const DELETE_PERMISSION: u8 = 17;
const USERS_SEEDED: u8 = 18;
const DELETE_VHOST: u8 = 19;
const PUT_TOPIC_PERMISSION: u8 = 20;
const DELETE_TOPIC_PERMISSION: u8 = 21;
const PUT_PARAMETER: u8 = 22;
const DELETE_PARAMETER: u8 = 23;
const PUT_GLOBAL_PARAMETER: u8 = 24;
const DELETE_GLOBAL_PARAMETER: u8 = 25;
const MOVE_MESSAGES: u8 = 26;
const CLUSTER_VERSION: u8 = 27;
const TRACK_OFFSET: u8 = 28;
const DEDUP: u8 = 29;

impl Op<'_> {
    /// Appends the versioned encoding to `out`.
    pub fn encode(&self, out: &mut BytesMut) -> Result<()> {
        out.put_u8(VERSION);
        match *self {
            Op::PutVhost(def) => {
                out.put_u8(PUT_VHOST);
                put_json(out, def)?;
            }
            Op::DeleteVhost { name } => {
                out.put_u8(DELETE_VHOST);
                put_str(out, name);
            }
            Op::PutTopicPermission(def) => {
                out.put_u8(PUT_TOPIC_PERMISSION);
                put_json(out, def)?;
            }
            Op::DeleteTopicPermission {
                vhost,
                user,
                exchange,
            } => {
                out.put_u8(DELETE_TOPIC_PERMISSION);
                put_str(out, vhost);
                put_str(out, user);
                put_str(out, exchange);
            }
            Op::PutParameter(def) => {
                out.put_u8(PUT_PARAMETER);
                put_json(out, def)?;
            }
            Op::DeleteParameter {
                vhost,
                component,
                name,
            } => {
                out.put_u8(DELETE_PARAMETER);
                put_str(out, vhost);
                put_str(out, component);
                put_str(out, name);
            }
            Op::PutGlobalParameter(def) => {
                out.put_u8(PUT_GLOBAL_PARAMETER);
                put_json(out, def)?;
            }
            Op::DeleteGlobalParameter { name } => {
                out.put_u8(DELETE_GLOBAL_PARAMETER);
                put_str(out, name);
            }
            Op::PutExchange(def) => {
                out.put_u8(PUT_EXCHANGE);
                put_json(out, def)?;
            }
            Op::DeleteExchange { vhost, name } => {
                out.put_u8(DELETE_EXCHANGE);
                put_str(out, vhost);
                put_str(out, name);
            }
            Op::DeclareQueue(def) => {
                out.put_u8(DECLARE_QUEUE);
                put_json(out, def)?;
            }
            Op::DeleteQueue { vhost, name, id } => {
                out.put_u8(DELETE_QUEUE);
                put_str(out, vhost);
                put_str(out, name);
                out.put_u64(id);
            }
            Op::PutBinding(def) => {
                out.put_u8(PUT_BINDING);
                put_json(out, def)?;
            }
            Op::DeleteBinding(def) => {
                out.put_u8(DELETE_BINDING);
                put_json(out, def)?;
            }
            Op::PutMessage {
                queue_id,
                seq,
                deadline,
                paged,
                time,
                message,
            } => {
                out.put_u8(PUT_MESSAGE);
                out.put_u64(queue_id);
                out.put_u64(seq);
                append_record(message, paged, deadline, time, out);
            }
            Op::RemoveMessage { queue_id, seq } => {
                out.put_u8(REMOVE_MESSAGE);
                out.put_u64(queue_id);
                out.put_u64(seq);
            }
            Op::PurgeFrom { queue_id, from } => {
                out.put_u8(PURGE_FROM);
                out.put_u64(queue_id);
                out.put_u64(from);
            }
            Op::Hold {
                due,
                seq,
                vhost,
                delay_ms,
                message,
            } => {
                out.put_u8(HOLD);
                out.put_u64(due);
                out.put_u64(seq);
                put_str(out, vhost);
                out.put_u64(delay_ms);
                append_record(message, false, 0, 0, out);
            }
            Op::Unhold { key } => {
                out.put_u8(UNHOLD);
                out.put_u32(key.len() as u32);
                out.extend_from_slice(key);
            }
            Op::PutUser(def) => {
                out.put_u8(PUT_USER);
                put_json(out, def)?;
            }
            Op::DeleteUser { name } => {
                out.put_u8(DELETE_USER);
                put_str(out, name);
            }
            Op::PutPermission(def) => {
                out.put_u8(PUT_PERMISSION);
                put_json(out, def)?;
            }
            Op::DeletePermission { vhost, user } => {
                out.put_u8(DELETE_PERMISSION);
                put_str(out, vhost);
                put_str(out, user);
            }
            Op::UsersSeeded => out.put_u8(USERS_SEEDED),
            Op::ClusterVersion { level } => {
                out.put_u8(CLUSTER_VERSION);
                out.put_u32(level);
            }
            Op::TrackOffset {
                queue_id,
                name,
                offset,
            } => {
                out.put_u8(TRACK_OFFSET);
                out.put_u64(queue_id);
                put_str(out, name);
                out.put_u64(offset);
            }
            Op::Dedup {
                owner,
                slot,
                seq,
                expires,
                key,
            } => {
                out.put_u8(DEDUP);
                out.put_u32(owner.len() as u32);
                out.extend_from_slice(owner);
                out.put_u64(slot);
                out.put_u64(seq);
                out.put_u64(expires);
                out.extend_from_slice(&key);
            }
            Op::Reserve { queue_id, upto } => {
                out.put_u8(RESERVE);
                out.put_u64(queue_id);
                out.put_u64(upto);
            }
            Op::MoveMessages {
                from,
                to,
                moves,
                removes,
            } => {
                out.put_u8(MOVE_MESSAGES);
                out.put_u64(from);
                out.put_u64(to);
                out.put_u32(moves.len() as u32);
                let mut rec = BytesMut::new();
                for m in moves {
                    out.put_u64(m.from_seq);
                    out.put_u64(m.to_seq);
                    encode_record(m.message, false, m.deadline, m.time, &mut rec);
                    out.put_u32(rec.len() as u32);
                    out.extend_from_slice(&rec);
                }
                out.put_u32(removes.len() as u32);
                for &seq in removes {
                    out.put_u64(seq);
                }
            }
        }
        Ok(())
    }
}

/// Decodes one encoded operation and hands it to `f` (the operation
/// borrows what decoding made, so it lives only for the call).
pub fn decode<R>(raw: Bytes, f: impl FnOnce(Op<'_>) -> R) -> Result<R> {
    let bad = |what: &str| Error::Corrupt(format!("operation: {what}"));
    let mut r = FieldReader::new(&raw);
    match r.u8() {
        Some(VERSION) => {}
        Some(v) => return Err(bad(&format!("unknown version {v}"))),
        None => return Err(bad("empty")),
    }
    let tag = r.u8().ok_or_else(|| bad("no tag"))?;
    let u64_ = |r: &mut FieldReader<'_>| r.u64().ok_or_else(|| bad("short"));
    let str_ = |r: &mut FieldReader<'_>| -> Result<String> {
        let s = r.long_str().ok_or_else(|| bad("short"))?;
        String::from_utf8(s.to_vec()).map_err(|_| bad("name is not UTF-8"))
    };
    let record = |r: &FieldReader<'_>| -> Result<Decoded> {
        let at = raw.len() - r.remaining();
        decode_record(raw.slice(at..))
    };
    Ok(match tag {
        PUT_VHOST => f(Op::PutVhost(&json(&mut r)?)),
        DELETE_VHOST => f(Op::DeleteVhost {
            name: &str_(&mut r)?,
        }),
        PUT_TOPIC_PERMISSION => f(Op::PutTopicPermission(&json(&mut r)?)),
        DELETE_TOPIC_PERMISSION => {
            let vhost = str_(&mut r)?;
            let user = str_(&mut r)?;
            f(Op::DeleteTopicPermission {
                vhost: &vhost,
                user: &user,
                exchange: &str_(&mut r)?,
            })
        }
        PUT_PARAMETER => f(Op::PutParameter(&json(&mut r)?)),
        DELETE_PARAMETER => {
            let vhost = str_(&mut r)?;
            let component = str_(&mut r)?;
            f(Op::DeleteParameter {
                vhost: &vhost,
                component: &component,
                name: &str_(&mut r)?,
            })
        }
        PUT_GLOBAL_PARAMETER => f(Op::PutGlobalParameter(&json(&mut r)?)),
        DELETE_GLOBAL_PARAMETER => f(Op::DeleteGlobalParameter {
            name: &str_(&mut r)?,
        }),
        PUT_EXCHANGE => f(Op::PutExchange(&json(&mut r)?)),
        DELETE_EXCHANGE => {
            let vhost = str_(&mut r)?;
            f(Op::DeleteExchange {
                vhost: &vhost,
                name: &str_(&mut r)?,
            })
        }
        DECLARE_QUEUE => f(Op::DeclareQueue(&json(&mut r)?)),
        DELETE_QUEUE => {
            let vhost = str_(&mut r)?;
            let name = str_(&mut r)?;
            f(Op::DeleteQueue {
                vhost: &vhost,
                name: &name,
                id: u64_(&mut r)?,
            })
        }
        PUT_BINDING => f(Op::PutBinding(&json(&mut r)?)),
        DELETE_BINDING => f(Op::DeleteBinding(&json(&mut r)?)),
        PUT_MESSAGE => {
            let queue_id = u64_(&mut r)?;
            let seq = u64_(&mut r)?;
            let d = record(&r)?;
            f(Op::PutMessage {
                queue_id,
                seq,
                deadline: d.deadline,
                paged: d.paged,
                time: d.time,
                message: &d.message,
            })
        }
        REMOVE_MESSAGE => f(Op::RemoveMessage {
            queue_id: u64_(&mut r)?,
            seq: u64_(&mut r)?,
        }),
        PURGE_FROM => f(Op::PurgeFrom {
            queue_id: u64_(&mut r)?,
            from: u64_(&mut r)?,
        }),
        HOLD => {
            let due = u64_(&mut r)?;
            let seq = u64_(&mut r)?;
            let vhost = str_(&mut r)?;
            let delay_ms = u64_(&mut r)?;
            let message = record(&r)?.message;
            f(Op::Hold {
                due,
                seq,
                vhost: &vhost,
                delay_ms,
                message: &message,
            })
        }
        UNHOLD => f(Op::Unhold {
            key: r.long_str().ok_or_else(|| bad("short"))?,
        }),
        RESERVE => f(Op::Reserve {
            queue_id: u64_(&mut r)?,
            upto: u64_(&mut r)?,
        }),
        MOVE_MESSAGES => {
            let from = u64_(&mut r)?;
            let to = u64_(&mut r)?;
            let n = count(&mut r, 20)?;
            let mut messages = Vec::with_capacity(n);
            for _ in 0..n {
                let (a, b) = (u64_(&mut r)?, u64_(&mut r)?);
                let len = r.u32().ok_or_else(|| bad("short"))? as usize;
                let at = raw.len() - r.remaining();
                r.take(len).ok_or_else(|| bad("short"))?;
                messages.push((a, b, decode_record(raw.slice(at..at + len))?));
            }
            let moves: Vec<Moved<'_>> = messages
                .iter()
                .map(|(from_seq, to_seq, d)| Moved {
                    from_seq: *from_seq,
                    to_seq: *to_seq,
                    deadline: d.deadline,
                    time: d.time,
                    message: &d.message,
                })
                .collect();
            let n = count(&mut r, 8)?;
            let mut removes = Vec::with_capacity(n);
            for _ in 0..n {
                removes.push(u64_(&mut r)?);
            }
            f(Op::MoveMessages {
                from,
                to,
                moves: &moves,
                removes: &removes,
            })
        }
        PUT_USER => f(Op::PutUser(&json(&mut r)?)),
        DELETE_USER => f(Op::DeleteUser {
            name: &str_(&mut r)?,
        }),
        PUT_PERMISSION => f(Op::PutPermission(&json(&mut r)?)),
        DELETE_PERMISSION => {
            let vhost = str_(&mut r)?;
            f(Op::DeletePermission {
                vhost: &vhost,
                user: &str_(&mut r)?,
            })
        }
        USERS_SEEDED => f(Op::UsersSeeded),
        CLUSTER_VERSION => f(Op::ClusterVersion {
            level: r.u32().ok_or_else(|| bad("short"))?,
        }),
        TRACK_OFFSET => {
            let queue_id = u64_(&mut r)?;
            let name = str_(&mut r)?;
            f(Op::TrackOffset {
                queue_id,
                name: &name,
                offset: u64_(&mut r)?,
            })
        }
        DEDUP => {
            let owner = r.long_str().ok_or_else(|| bad("short"))?;
            let slot = u64_(&mut r)?;
            let seq = u64_(&mut r)?;
            let expires = u64_(&mut r)?;
            let key = r
                .take(16)
                .and_then(|k| <[u8; 16]>::try_from(k).ok())
                .ok_or_else(|| bad("short"))?;
            f(Op::Dedup {
                owner,
                slot,
                seq,
                expires,
                key,
            })
        }
        t => return Err(bad(&format!("unknown tag {t}"))),
    })
}

/// A u32 count of items of `size` bytes each, no more than are left.
fn count(r: &mut FieldReader<'_>, size: usize) -> Result<usize> {
    let n = r.u32().ok_or_else(|| Error::Corrupt("operation".into()))? as usize;
    if n.saturating_mul(size) > r.remaining() {
        return Err(Error::Corrupt("operation".into()));
    }
    Ok(n)
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u32(s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn json<T: serde::de::DeserializeOwned>(r: &mut FieldReader<'_>) -> Result<T> {
    let bytes = r
        .long_str()
        .ok_or_else(|| Error::Corrupt("operation: short".into()))?;
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt(format!("operation: {e}")))
}

fn put_json(out: &mut BytesMut, v: &impl serde::Serialize) -> Result<()> {
    let bytes = serde_json::to_vec(v).map_err(|e| Error::Corrupt(e.to_string()))?;
    out.put_u32(bytes.len() as u32);
    out.extend_from_slice(&bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;
    use amq_protocol::types::{AMQPValue, FieldTable};

    fn msg() -> Message {
        Message::new(
            b"amq.direct",
            b"rk",
            &[0x10, 0, 2],
            b"body",
            Meta::default().with_delivery_mode(2),
        )
    }

    fn args() -> FieldTable {
        let mut t = FieldTable::default();
        t.insert("x-message-ttl".into(), AMQPValue::LongInt(5));
        t
    }

    /// Every kind of operation reads back as itself.
    #[test]
    fn every_operation_round_trips() {
        let m = msg();
        let x = ExchangeDef {
            vhost: "/".into(),
            name: "x".into(),
            kind: "topic".into(),
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: args(),
        };
        let q = QueueDef {
            vhost: "/".into(),
            name: "q".into(),
            id: 0,
            auto_delete: false,
            arguments: args(),
        };
        let b = BindingDef {
            vhost: "/".into(),
            source: "x".into(),
            destination: "q".into(),
            to_exchange: false,
            routing_key: "a.#".into(),
            arguments: args(),
        };
        let user = UserDef {
            name: "app".into(),
            password_hash: "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR".into(),
            hashing_algorithm: "rabbit_password_hashing_sha256".into(),
            tags: vec!["management".into()],
            limits: [("max-channels".to_string(), 5)].into(),
        };
        let perm = PermissionDef {
            user: "app".into(),
            vhost: "/".into(),
            configure: "^$".into(),
            write: ".*".into(),
            read: ".*".into(),
        };
        let vhost = VhostDef {
            name: "v".into(),
            description: "d".into(),
            tags: vec!["a".into()],
            default_queue_type: "classic".into(),
        };
        let topic = TopicPermissionDef {
            user: "app".into(),
            vhost: "/".into(),
            exchange: "amq.topic".into(),
            write: "^a".into(),
            read: ".*".into(),
        };
        let param = ParameterDef {
            vhost: "/".into(),
            component: "policy".into(),
            name: "p".into(),
            value: serde_json::json!({"pattern": ".*", "definition": {"max-length": 3}}),
        };
        let global = GlobalParameterDef {
            name: "cluster_name".into(),
            value: serde_json::json!("c"),
        };
        let ops = [
            Op::PutVhost(&vhost),
            Op::DeleteVhost { name: "v" },
            Op::PutTopicPermission(&topic),
            Op::DeleteTopicPermission {
                vhost: "/",
                user: "app",
                exchange: "",
            },
            Op::PutParameter(&param),
            Op::DeleteParameter {
                vhost: "/",
                component: "policy",
                name: "p",
            },
            Op::PutGlobalParameter(&global),
            Op::DeleteGlobalParameter {
                name: "cluster_name",
            },
            Op::PutExchange(&x),
            Op::DeleteExchange {
                vhost: "/",
                name: "x",
            },
            Op::DeclareQueue(&q),
            Op::DeleteQueue {
                vhost: "/",
                name: "q",
                id: 7,
            },
            Op::PutBinding(&b),
            Op::DeleteBinding(&b),
            Op::PutMessage {
                queue_id: 3,
                seq: 9,
                deadline: 1_700_000_000_000,
                paged: false,
                time: 0,
                message: &m,
            },
            Op::PutMessage {
                queue_id: 3,
                seq: 10,
                deadline: 0,
                paged: true,
                time: 1_700_000_000_001,
                message: &m,
            },
            Op::RemoveMessage {
                queue_id: 3,
                seq: 9,
            },
            Op::PurgeFrom {
                queue_id: 3,
                from: 4,
            },
            Op::Hold {
                due: 5,
                seq: 6,
                vhost: "/",
                delay_ms: 100,
                message: &m,
            },
            Op::Unhold {
                key: &[0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6],
            },
            Op::Reserve {
                queue_id: 3,
                upto: 1024,
            },
            Op::MoveMessages {
                from: 3,
                to: 4,
                moves: &[
                    Moved {
                        from_seq: 1,
                        to_seq: 7,
                        deadline: 0,
                        time: 1_700_000_000_002,
                        message: &m,
                    },
                    Moved {
                        from_seq: 0,
                        to_seq: 8,
                        deadline: 1_700_000_000_000,
                        time: 0,
                        message: &m,
                    },
                ],
                removes: &[5],
            },
            Op::PutUser(&user),
            Op::DeleteUser { name: "app" },
            Op::PutPermission(&perm),
            Op::DeletePermission {
                vhost: "/",
                user: "app",
            },
            Op::UsersSeeded,
            Op::ClusterVersion { level: 2 },
            Op::TrackOffset {
                queue_id: 3,
                name: "reader-1",
                offset: 1 << 40,
            },
            Op::Dedup {
                owner: b"q\0\0\0\0\0\0\0\x07",
                slot: 5,
                seq: 133,
                expires: 1 << 41,
                key: [9; 16],
            },
        ];
        for op in ops {
            let mut buf = BytesMut::new();
            op.encode(&mut buf).unwrap();
            assert_eq!(buf[0], VERSION);
            let first = buf.clone().freeze();
            let again = decode(buf.freeze(), |back| {
                let mut b = BytesMut::new();
                back.encode(&mut b).unwrap();
                b.freeze()
            })
            .unwrap();
            assert_eq!(again, first, "{op:?}");
        }
    }

    /// A message's time needs the cluster version that reads it; without
    /// it the operation is the one an older member applies.
    #[test]
    fn a_time_needs_its_cluster_version() {
        let m = Message::new(b"", b"q", &[0, 0], b"b", Meta::default());
        let put = Op::PutMessage {
            queue_id: 3,
            seq: 9,
            deadline: 5,
            paged: false,
            time: 1_700_000_000_000,
            message: &m,
        };
        assert_eq!(put.level(), TIMED_RECORDS);
        let mut moves = Vec::new();
        let bare = put.untimed(&mut moves);
        assert_eq!(bare.level(), 1);
        let decoded_time = |op: &Op<'_>| {
            let mut buf = BytesMut::new();
            op.encode(&mut buf).unwrap();
            decode(buf.freeze(), |back| match back {
                Op::PutMessage { time, deadline, .. } => (time, deadline),
                Op::MoveMessages { moves, .. } => (moves[0].time, moves[0].deadline),
                _ => unreachable!("a put or a move"),
            })
            .unwrap()
        };
        assert_eq!(decoded_time(&put), (1_700_000_000_000, 5));
        assert_eq!(decoded_time(&bare), (0, 5));
        let timed = [Moved {
            from_seq: 1,
            to_seq: 2,
            deadline: 5,
            time: 8,
            message: &m,
        }];
        let mv = Op::MoveMessages {
            from: 1,
            to: 2,
            moves: &timed,
            removes: &[],
        };
        assert_eq!(mv.level(), TIMED_RECORDS);
        let bare = mv.untimed(&mut moves);
        assert_eq!(bare.level(), 1);
        assert_eq!(decoded_time(&bare), (0, 5));
    }

    #[test]
    fn unknown_versions_and_tags_are_refused() {
        assert!(decode(Bytes::from_static(&[2, 1]), |_| ()).is_err());
        assert!(decode(Bytes::from_static(&[VERSION, 99]), |_| ()).is_err());
        assert!(decode(Bytes::from_static(&[VERSION, REMOVE_MESSAGE, 0]), |_| ()).is_err());
        assert!(decode(Bytes::new(), |_| ()).is_err());
    }
}
