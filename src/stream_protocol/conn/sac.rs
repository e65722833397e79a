//! A connection's side of single active consumer (groups.rs has the
//! groups): a group's update becomes a ConsumerUpdate to the client, the
//! client's answer starts the reader or finishes a step-down, and a
//! client that leaves one unanswered for `ANSWER_WAIT` loses its
//! connection (and with it its places in groups), as RabbitMQ closes a
//! connection with a request outstanding past its `request_timeout`.

use std::sync::Arc;
use std::time::Instant;

use bytes::BufMut;

use super::super::codes::*;
use super::super::groups::{Update, ANSWER_WAIT};
use super::super::subscribe::{self, Asked};
use super::super::wire;
use super::Conn;

impl Conn {
    /// A group says a subscription is active or not: the client is told;
    /// one no longer active has stopped reading before it is.
    pub(super) async fn update(&mut self, u: Update) {
        self.correlation = self.correlation.wrapping_add(1);
        let correlation = self.correlation;
        let Some(sub) = self.subscriptions.get_mut(&u.sub) else {
            return;
        };
        let Some(sac) = sub.sac.as_mut().filter(|s| s.membership.id == u.member) else {
            return;
        };
        // Only the latest question counts.
        sac.asked = Some(Asked {
            correlation,
            active: u.active,
            epoch: u.epoch,
            at: Instant::now(),
        });
        if !u.active {
            sub.stop().await;
        }
        self.out
            .write(|o| {
                wire::frame(o, CONSUMER_UPDATE, 1, |o| {
                    o.put_u32(correlation);
                    o.put_u8(u.sub);
                    o.put_u8(u8::from(u.active));
                })
            })
            .await;
    }

    /// The client answered ConsumerUpdate `correlation`: an active one
    /// starts reading where it says (kind 0: where it subscribed to); one
    /// told to step down has, and its group moves on.
    pub(super) async fn answered(&mut self, correlation: u32, (kind, value): (u16, u64)) {
        let asked = |a: &Option<Asked>| a.is_some_and(|a| a.correlation == correlation);
        let Some(id) = self
            .subscriptions
            .iter()
            .find(|(_, s)| s.sac.as_ref().is_some_and(|s| asked(&s.asked)))
            .map(|(id, _)| *id)
        else {
            return;
        };
        let Some(sub) = self.subscriptions.get_mut(&id) else {
            return;
        };
        let Some(sac) = sub.sac.as_mut() else { return };
        let Some(a) = sac.asked.take() else { return };
        if !a.active {
            self.groups
                .stepped_down(&sac.membership.key, sac.membership.id, a.epoch);
            return;
        }
        let (own, filter) = (sac.spec, sac.filter.clone());
        let start = subscribe::start_of(kind, value)
            .or_else(|| subscribe::start_of(own.0, own.1))
            .unwrap_or(crate::queue::stream::Start::Next);
        let target = sub.target.clone();
        let queue = Arc::clone(&target.queue);
        match queue.stream().map(|s| s.place(&queue, start)) {
            Some(Ok(first)) => {
                let reader = self.reader(id, target, first, filter);
                if let Some(sub) = self.subscriptions.get_mut(&id) {
                    sub.start(reader);
                }
            }
            // Its stream went: the client is told, and the subscription
            // goes (handing the group over).
            _ => {
                subscribe::gone(&self.out, &target.stream).await;
                self.subscriptions.remove(&id);
            }
        }
    }

    /// Subscription `id` ended by itself (its stream went): if it is still
    /// the one with that serial, it goes and the client is told (here,
    /// where nothing aborts the telling).
    pub(super) async fn ended(&mut self, id: u8, serial: u64) {
        if self
            .subscriptions
            .get(&id)
            .is_some_and(|s| s.target.ending.serial == serial)
        {
            if let Some(sub) = self.subscriptions.remove(&id) {
                subscribe::gone(&self.out, &sub.target.stream).await;
            }
        }
    }

    /// Whether a ConsumerUpdate has waited for its answer too long.
    pub(super) fn overdue(&self) -> bool {
        self.subscriptions.values().any(|s| {
            s.sac
                .as_ref()
                .and_then(|s| s.asked)
                .is_some_and(|a| a.at.elapsed() > ANSWER_WAIT)
        })
    }
}
