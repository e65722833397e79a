//! Dead-lettering: the message a queue hands to its dead-letter exchange,
//! with RabbitMQ's `x-death` header (an array of tables, newest first, one
//! per {queue, reason} with a `count`), `x-first-death-*` and
//! `x-last-death-*`, and the rule that breaks dead-letter cycles.

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString};

use crate::message::{read_meta, Message};
use crate::wire::props::{self, Field};
use crate::wire::table;

/// Why a message was dead-lettered (the `reason` in x-death).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// basic.reject / basic.nack with requeue=false.
    Rejected,
    /// Its TTL ran out.
    Expired,
    /// Dropped or refused by a length limit.
    MaxLen,
    /// Redelivered more often than x-delivery-limit allows.
    DeliveryLimit,
}

impl Reason {
    /// RabbitMQ's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rejected => "rejected",
            Reason::Expired => "expired",
            Reason::MaxLen => "maxlen",
            Reason::DeliveryLimit => "delivery_limit",
        }
    }
}

fn long_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn long_bytes(b: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(b))
}

fn text(v: Option<&AMQPValue>) -> Option<String> {
    v.and_then(crate::wire::value::text)
}

/// Builds the message that goes to the dead-letter exchange `dlx` with
/// routing key `dlrk` (None: the message's own routing key). `now` is the
/// time in seconds since the epoch. Only what dead-lettering changes is
/// rewritten: the x-death and x-*-death-* headers (and CC, with `dlrk`),
/// and the expiration property, which is dropped; every other property
/// and header keeps the bytes the publisher sent.
pub fn dead_letter(
    msg: &Message,
    queue: &str,
    reason: Reason,
    dlx: &str,
    dlrk: Option<&str>,
    now: u64,
) -> Message {
    // Checked here, since to_amqp recurses: a record an older version
    // stored with headers nested too deep has its headers read as absent.
    let raw_headers = msg.raw_headers().filter(|h| table::check_table(h).is_ok());
    let old = |key: &str| raw_headers.and_then(|h| table::get(h, key.as_bytes()));
    let mut deaths: Vec<AMQPValue> = match old("x-death").map(table::to_amqp) {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let same = |t: &FieldTable| {
        text(t.inner().get("queue")).as_deref() == Some(queue)
            && text(t.inner().get("reason")).as_deref() == Some(reason.as_str())
    };
    let found = deaths
        .iter()
        .position(|d| matches!(d, AMQPValue::FieldTable(t) if same(t)));
    let entry = match found.map(|i| deaths.remove(i)) {
        Some(AMQPValue::FieldTable(mut t)) => {
            // A count a client made up may be anything: saturate.
            let count = match t.inner().get("count") {
                Some(v) => crate::wire::value::int(v).unwrap_or(0),
                None => 0,
            };
            t.insert(
                "count".into(),
                AMQPValue::LongLongInt(count.saturating_add(1)),
            );
            t.insert("time".into(), AMQPValue::Timestamp(now));
            t
        }
        _ => {
            let mut t = FieldTable::default();
            t.insert("count".into(), AMQPValue::LongLongInt(1));
            t.insert("reason".into(), long_str(reason.as_str()));
            t.insert("queue".into(), long_str(queue));
            t.insert("time".into(), AMQPValue::Timestamp(now));
            t.insert("exchange".into(), long_bytes(msg.exchange()));
            // The routing keys it was published with: CC's too, not BCC's
            // (already stripped at publish).
            let mut keys = FieldArray::default();
            keys.push(long_bytes(msg.routing_key()));
            if let Some(AMQPValue::FieldArray(cc)) = old("CC").map(table::to_amqp) {
                for k in cc.as_slice() {
                    if matches!(k, AMQPValue::LongString(_) | AMQPValue::ShortString(_)) {
                        keys.push(k.clone());
                    }
                }
            }
            t.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
            if let Some(exp) = props::short_str(msg.properties(), Field::Expiration) {
                t.insert("original-expiration".into(), long_bytes(exp));
            }
            t
        }
    };
    deaths.insert(0, AMQPValue::FieldTable(entry));
    let encode = |v: &AMQPValue| {
        let mut out = Vec::new();
        table::encode_value(&mut out, v);
        out
    };
    let x_death = encode(&AMQPValue::FieldArray(deaths.into()));
    let name = encode(&long_str(queue));
    let why = encode(&long_str(reason.as_str()));
    let exchange = encode(&long_bytes(msg.exchange()));
    let mut set: Vec<(&[u8], &[u8])> = vec![(b"x-death", &x_death)];
    if old("x-first-death-queue").is_none() {
        set.push((b"x-first-death-queue", &name));
        set.push((b"x-first-death-reason", &why));
        set.push((b"x-first-death-exchange", &exchange));
    }
    set.push((b"x-last-death-queue", &name));
    set.push((b"x-last-death-reason", &why));
    set.push((b"x-last-death-exchange", &exchange));
    // With x-dead-letter-routing-key the copy goes by that key alone, so
    // CC goes (as in RabbitMQ); without it, CC routes the copy again.
    let remove: &[&[u8]] = if dlrk.is_some() { &[b"CC"] } else { &[] };
    // The per-message TTL does not follow the message (it is kept in
    // original-expiration), or it would expire again at once.
    let properties = props::with_field(msg.properties(), Field::Expiration, None)
        .and_then(|p| props::edit_headers(&p, &set, remove))
        .unwrap_or_else(|| msg.properties().to_vec());
    let meta = read_meta(&properties).unwrap_or_default();
    let routing_key = dlrk.map_or(msg.routing_key(), str::as_bytes);
    Message::new(dlx.as_bytes(), routing_key, &properties, msg.body(), meta)
}

/// RabbitMQ's cycle rule: a dead-lettered message does not go back to a
/// queue it already died in, unless a rejection happened since it last
/// died there (x-death is newest first: look at the entries up to and
/// including the target queue's).
pub fn is_cycle(msg: &Message, target_queue: &str) -> bool {
    let Some(headers) = msg.headers() else {
        return false;
    };
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        return false;
    };
    for d in deaths.as_slice() {
        let AMQPValue::FieldTable(t) = d else {
            continue;
        };
        if text(t.inner().get("reason")).as_deref() == Some("rejected") {
            return false;
        }
        if text(t.inner().get("queue")).as_deref() == Some(target_queue) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::encode_properties;
    use amq_protocol::protocol::basic::AMQPProperties;

    fn message(props: AMQPProperties) -> Message {
        let properties = encode_properties(&props);
        let meta = read_meta(&properties).unwrap_or_default();
        Message::new(b"orders", b"new", &properties, b"body", meta)
    }

    fn deaths(m: &Message) -> Vec<FieldTable> {
        match m.headers().and_then(|h| h.inner().get("x-death").cloned()) {
            Some(AMQPValue::FieldArray(a)) => a
                .as_slice()
                .iter()
                .filter_map(|v| match v {
                    AMQPValue::FieldTable(t) => Some(t.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn first_death_records_everything() {
        let m = message(
            AMQPProperties::default()
                .with_expiration("500".into())
                .with_app_id("a".into()),
        );
        let d = dead_letter(&m, "q1", Reason::Expired, "dlx", None, 1000);
        assert_eq!(d.exchange(), b"dlx");
        assert_eq!(d.routing_key(), b"new");
        assert_eq!(d.meta.expiration_ms(), None, "expiration does not follow");
        assert_eq!(
            d.decoded_properties().app_id().as_ref().map(|s| s.as_str()),
            Some("a")
        );
        let x = deaths(&d);
        assert_eq!(x.len(), 1);
        let t = x[0].inner();
        assert_eq!(t.get("count"), Some(&AMQPValue::LongLongInt(1)));
        assert_eq!(text(t.get("reason")).as_deref(), Some("expired"));
        assert_eq!(text(t.get("queue")).as_deref(), Some("q1"));
        assert_eq!(text(t.get("exchange")).as_deref(), Some("orders"));
        assert_eq!(text(t.get("original-expiration")).as_deref(), Some("500"));
        assert_eq!(t.get("time"), Some(&AMQPValue::Timestamp(1000)));
        let h = d.headers().unwrap_or_default();
        assert_eq!(
            text(h.inner().get("x-first-death-queue")).as_deref(),
            Some("q1")
        );
        assert_eq!(
            text(h.inner().get("x-last-death-reason")).as_deref(),
            Some("expired")
        );
    }

    #[test]
    fn repeated_deaths_count_and_newest_first() {
        let m = message(AMQPProperties::default());
        let d1 = dead_letter(&m, "q1", Reason::Rejected, "dlx", Some("k"), 1);
        assert_eq!(d1.routing_key(), b"k");
        let d2 = dead_letter(&d1, "q2", Reason::Expired, "dlx", None, 2);
        let d3 = dead_letter(&d2, "q1", Reason::Rejected, "dlx", None, 3);
        let x = deaths(&d3);
        assert_eq!(x.len(), 2);
        assert_eq!(text(x[0].inner().get("queue")).as_deref(), Some("q1"));
        assert_eq!(x[0].inner().get("count"), Some(&AMQPValue::LongLongInt(2)));
        assert_eq!(text(x[1].inner().get("queue")).as_deref(), Some("q2"));
        let h = d3.headers().unwrap_or_default();
        assert_eq!(
            text(h.inner().get("x-first-death-queue")).as_deref(),
            Some("q1")
        );
        assert_eq!(
            text(h.inner().get("x-last-death-queue")).as_deref(),
            Some("q1")
        );
    }

    #[test]
    fn a_count_a_client_made_up_saturates() {
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(i64::MAX));
        death.insert("queue".into(), long_str("q1"));
        death.insert("reason".into(), long_str("rejected"));
        let mut headers = FieldTable::default();
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
        );
        let m = message(AMQPProperties::default().with_headers(headers));
        let d = dead_letter(&m, "q1", Reason::Rejected, "dlx", None, 1);
        assert_eq!(
            deaths(&d)[0].inner().get("count"),
            Some(&AMQPValue::LongLongInt(i64::MAX))
        );
    }

    #[test]
    fn cycles_without_rejection_are_cut() {
        let m = message(AMQPProperties::default());
        let expired = dead_letter(&m, "q1", Reason::Expired, "dlx", None, 1);
        assert!(is_cycle(&expired, "q1"));
        assert!(!is_cycle(&expired, "q2"));
        let rejected = dead_letter(&m, "q1", Reason::Rejected, "dlx", None, 1);
        assert!(!is_cycle(&rejected, "q1"));
    }

    #[test]
    fn cc_keys_are_recorded_and_cc_goes_with_a_dead_letter_routing_key() {
        let mut headers = FieldTable::default();
        let mut cc = FieldArray::default();
        cc.push(long_str("c1"));
        cc.push(long_str("c2"));
        headers.insert("CC".into(), AMQPValue::FieldArray(cc));
        let m = message(AMQPProperties::default().with_headers(headers));
        let keys = |d: &Message| match deaths(d)[0].inner().get("routing-keys") {
            Some(AMQPValue::FieldArray(a)) => a
                .as_slice()
                .iter()
                .filter_map(|v| text(Some(v)))
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let kept = dead_letter(&m, "q1", Reason::Rejected, "dlx", None, 1);
        assert_eq!(keys(&kept), ["new", "c1", "c2"]);
        assert!(kept.headers().unwrap_or_default().contains_key("CC"));
        let rekeyed = dead_letter(&m, "q1", Reason::Rejected, "dlx", Some("k"), 1);
        assert_eq!(keys(&rekeyed), ["new", "c1", "c2"]);
        assert!(!rekeyed.headers().unwrap_or_default().contains_key("CC"));
    }
}
