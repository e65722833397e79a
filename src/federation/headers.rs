//! What an exchange link writes into what it moves, as RabbitMQ's
//! federation does: a message republished downstream gets a table
//! prepended to its `x-received-from` array (where it came from), and a
//! binding replayed upstream gets one prepended to its `x-bound-from`
//! argument (which downstream asked, and how many hops it may still go).

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::BasicProperties;

use crate::plugins::federation_upstream::RECEIVED_FROM;

/// The binding argument a replayed binding carries.
pub const BOUND_FROM: &str = "x-bound-from";

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// Where a link's messages come from.
pub struct Source<'a> {
    /// The upstream URI, without credentials.
    pub uri: &'a str,
    /// The downstream exchange (RabbitMQ writes this one's name).
    pub exchange: &'a str,
    /// The upstream's cluster name, if it announced one.
    pub cluster: Option<&'a str>,
    /// The upstream vhost.
    pub vhost: &'a str,
}

/// `props` as the message goes on downstream: `x-received-from` gets its
/// new first entry (an older value that is not an array moves to
/// `x-invalid-headers`), and `user_id` goes unless it is trusted.
pub fn received(
    props: &BasicProperties,
    from: &Source<'_>,
    redelivered: bool,
    trust_user_id: bool,
) -> BasicProperties {
    let mut headers = props.headers().clone().unwrap_or_default();
    let mut entry = FieldTable::default();
    entry.insert("uri".into(), long(from.uri));
    entry.insert("exchange".into(), long(from.exchange));
    entry.insert("redelivered".into(), AMQPValue::Boolean(redelivered));
    if let Some(c) = from.cluster {
        entry.insert("cluster-name".into(), long(c));
    }
    entry.insert("vhost".into(), long(from.vhost));
    let mut hops = vec![AMQPValue::FieldTable(entry)];
    match headers.inner().get(RECEIVED_FROM).cloned() {
        None => {}
        Some(AMQPValue::FieldArray(old)) => hops.extend(old.as_slice().iter().cloned()),
        Some(other) => {
            let mut invalid = match headers.inner().get("x-invalid-headers") {
                Some(AMQPValue::FieldTable(t)) => t.clone(),
                _ => FieldTable::default(),
            };
            invalid.insert(RECEIVED_FROM.into(), other);
            headers.insert("x-invalid-headers".into(), AMQPValue::FieldTable(invalid));
        }
    }
    headers.insert(
        RECEIVED_FROM.into(),
        AMQPValue::FieldArray(FieldArray::from(hops)),
    );
    let mut p = props.clone().with_headers(headers);
    if !trust_user_id && p.user_id().is_some() {
        p = without_user_id(p);
    }
    p
}

/// What a queue link writes: where the message was (uri and the queue
/// here), with a visit count, since a message may move back and forth
/// between federated queues. The first time, its original exchange and
/// routing key are kept aside; a `CC` header is renamed so it does not
/// route again.
pub struct QueueSource<'a> {
    pub uri: &'a str,
    /// The queue here.
    pub queue: &'a str,
    pub exchange: &'a str,
    pub routing_key: &'a str,
}

/// `props` as a queue link republishes the message.
pub fn received_in_queue(
    props: &BasicProperties,
    from: &QueueSource<'_>,
    redelivered: bool,
    trust_user_id: bool,
) -> BasicProperties {
    let mut headers = props.headers().clone().unwrap_or_default();
    let old = match headers.inner().get(RECEIVED_FROM) {
        Some(AMQPValue::FieldArray(a)) => Some(a.as_slice().to_vec()),
        _ => None,
    };
    let old = match old {
        Some(o) => o,
        None => {
            headers.insert("x-original-exchange".into(), long(from.exchange));
            headers.insert("x-original-routing-key".into(), long(from.routing_key));
            Vec::new()
        }
    };
    let field = |t: &FieldTable, k: &str| t.inner().get(k).and_then(warren_plugin_api::value::text);
    let mut visits = 0i64;
    let mut rest = Vec::with_capacity(old.len());
    for e in old {
        match &e {
            AMQPValue::FieldTable(t)
                if field(t, "uri").as_deref() == Some(from.uri)
                    && field(t, "queue").as_deref() == Some(from.queue) =>
            {
                visits = t
                    .inner()
                    .get("visit-count")
                    .and_then(warren_plugin_api::value::int)
                    .unwrap_or(0);
            }
            _ => rest.push(e),
        }
    }
    let mut entry = FieldTable::default();
    entry.insert("uri".into(), long(from.uri));
    entry.insert("queue".into(), long(from.queue));
    entry.insert("redelivered".into(), AMQPValue::Boolean(redelivered));
    entry.insert("visit-count".into(), AMQPValue::LongLongInt(visits + 1));
    let mut hops = vec![AMQPValue::FieldTable(entry)];
    hops.extend(rest);
    headers.insert(
        RECEIVED_FROM.into(),
        AMQPValue::FieldArray(FieldArray::from(hops)),
    );
    if let Some(cc) = headers.inner().get("CC").cloned() {
        let mut h = FieldTable::default();
        for (k, v) in headers.inner() {
            if k.as_str() != "CC" {
                h.insert(k.clone(), v.clone());
            }
        }
        h.insert("x-original-cc".into(), cc);
        headers = h;
    }
    let mut p = props.clone().with_headers(headers);
    if !trust_user_id && p.user_id().is_some() {
        p = without_user_id(p);
    }
    p
}

/// `p` without its user_id (the builder cannot clear a field).
fn without_user_id(p: BasicProperties) -> BasicProperties {
    let mut out = BasicProperties::default();
    macro_rules! keep {
        ($get:ident, $with:ident) => {
            if let Some(v) = p.$get().clone() {
                out = out.$with(v);
            }
        };
    }
    keep!(content_type, with_content_type);
    keep!(content_encoding, with_content_encoding);
    keep!(headers, with_headers);
    keep!(delivery_mode, with_delivery_mode);
    keep!(priority, with_priority);
    keep!(correlation_id, with_correlation_id);
    keep!(reply_to, with_reply_to);
    keep!(expiration, with_expiration);
    keep!(message_id, with_message_id);
    keep!(timestamp, with_timestamp);
    keep!(kind, with_type);
    keep!(app_id, with_app_id);
    keep!(cluster_id, with_cluster_id);
    out
}

/// Which downstream a replayed binding speaks for.
pub struct Downstream<'a> {
    pub cluster: &'a str,
    pub vhost: &'a str,
    /// "<vhost>:<exchange> <upstream name>", RabbitMQ's label.
    pub exchange: &'a str,
}

/// The arguments a local binding is replayed upstream with, or None if it
/// must not go further: a binding of this broker's own gets `max_hops`;
/// one that a further downstream made here (it has `x-bound-from`) gets
/// one hop fewer than it had, and none if it came from the upstream
/// itself (a cycle).
pub fn bound_from(
    args: &FieldTable,
    max_hops: u32,
    upstream_cluster: Option<&str>,
    upstream_vhost: &str,
    me: &Downstream<'_>,
) -> Option<FieldTable> {
    let old = match args.inner().get(BOUND_FROM) {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let hops: i64 = match old.first() {
        None => i64::from(max_hops),
        Some(first) => {
            let prev = match first {
                AMQPValue::FieldTable(t) => t
                    .inner()
                    .get("hops")
                    .and_then(warren_plugin_api::value::int)
                    .unwrap_or(0),
                _ => 0,
            };
            let cycle = old.iter().any(|e| match e {
                AMQPValue::FieldTable(t) => {
                    let field = |k: &str| t.inner().get(k).and_then(warren_plugin_api::value::text);
                    upstream_cluster.is_some()
                        && field("cluster-name").as_deref() == upstream_cluster
                        && field("vhost").as_deref() == Some(upstream_vhost)
                }
                _ => false,
            });
            match cycle {
                true => 0,
                false => (prev - 1).min(i64::from(max_hops)),
            }
        }
    };
    if hops <= 0 {
        return None;
    }
    let mut entry = FieldTable::default();
    entry.insert("cluster-name".into(), long(me.cluster));
    entry.insert("vhost".into(), long(me.vhost));
    entry.insert("exchange".into(), long(me.exchange));
    entry.insert(
        "hops".into(),
        AMQPValue::ShortInt(hops.min(i64::from(i16::MAX)) as i16),
    );
    let mut entries = vec![AMQPValue::FieldTable(entry)];
    entries.extend(old);
    let mut out = args.clone();
    out.insert(
        BOUND_FROM.into(),
        AMQPValue::FieldArray(FieldArray::from(entries)),
    );
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Downstream<'static> {
        Downstream {
            cluster: "down",
            vhost: "/",
            exchange: "/:x up",
        }
    }

    fn hops(t: &FieldTable) -> Vec<(String, i64)> {
        match t.inner().get(BOUND_FROM) {
            Some(AMQPValue::FieldArray(a)) => a
                .as_slice()
                .iter()
                .map(|e| match e {
                    AMQPValue::FieldTable(t) => (
                        t.inner()
                            .get("cluster-name")
                            .and_then(warren_plugin_api::value::text)
                            .unwrap_or_default(),
                        t.inner()
                            .get("hops")
                            .and_then(warren_plugin_api::value::int)
                            .unwrap_or(-1),
                    ),
                    _ => (String::new(), -1),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn bindings_lose_a_hop_each_time_and_stop_at_a_cycle() {
        let own = bound_from(&FieldTable::default(), 3, Some("up"), "/", &me()).unwrap();
        assert_eq!(hops(&own), vec![("down".to_string(), 3)]);
        // Replayed again by the next broker up: one hop fewer.
        let next = Downstream {
            cluster: "up",
            vhost: "/",
            exchange: "/:x further",
        };
        let again = bound_from(&own, 3, Some("further"), "/", &next).unwrap();
        assert_eq!(hops(&again), vec![("up".into(), 2), ("down".into(), 3)]);
        // Back to where it came from: a cycle.
        assert!(bound_from(&again, 3, Some("down"), "/", &me()).is_none());
        // Out of hops.
        let one = bound_from(&FieldTable::default(), 1, Some("up"), "/", &me()).unwrap();
        assert!(bound_from(&one, 5, Some("z"), "/", &next).is_none());
    }

    #[test]
    fn a_queue_counts_visits_and_keeps_the_original_route() {
        let mut h = FieldTable::default();
        h.insert(
            "CC".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![long("k2")])),
        );
        let props = BasicProperties::default().with_headers(h);
        let from = QueueSource {
            uri: "amqp://h/",
            queue: "q",
            exchange: "x",
            routing_key: "k",
        };
        let once = received_in_queue(&props, &from, false, false);
        let twice = received_in_queue(&once, &from, true, false);
        let h = twice.headers().clone().unwrap();
        let h = h.inner();
        assert!(h.get("CC").is_none() && h.get("x-original-cc").is_some());
        assert_eq!(h.get("x-original-routing-key"), Some(&long("k")));
        match h.get(RECEIVED_FROM) {
            Some(AMQPValue::FieldArray(a)) => {
                assert_eq!(a.as_slice().len(), 1, "one entry per (uri, queue)");
                match &a.as_slice()[0] {
                    AMQPValue::FieldTable(t) => {
                        assert_eq!(
                            t.inner().get("visit-count"),
                            Some(&AMQPValue::LongLongInt(2))
                        )
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_received_message_says_where_from() {
        let props = BasicProperties::default().with_user_id("bob".into());
        let from = Source {
            uri: "amqp://h/",
            exchange: "x",
            cluster: Some("up"),
            vhost: "/",
        };
        let p = received(&props, &from, true, false);
        assert!(p.user_id().is_none());
        let p2 = received(&p, &from, false, true);
        match p2.headers().as_ref().unwrap().inner().get(RECEIVED_FROM) {
            Some(AMQPValue::FieldArray(a)) => assert_eq!(a.as_slice().len(), 2),
            other => panic!("{other:?}"),
        }
    }
}
