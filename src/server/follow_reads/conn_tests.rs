//! A carried connection's renumbering and ack splitting, frame by frame.

use amq_protocol::protocol::{basic, channel, connection, AMQPClass};
use amq_protocol::types::{FieldTable, LongString, ShortString};
use bytes::BytesMut;

use super::*;
use crate::amqp::codec::put_method;

fn method(ch: u16, m: AMQPClass) -> BytesMut {
    let mut out = BytesMut::new();
    put_method(&mut out, ch, m);
    out
}

fn deliver(ch: u16, consumer: &str, tag: u64) -> BytesMut {
    let msg = crate::message::Message::new(b"", b"q", &[0, 0], b"x", Default::default());
    let mut out = BytesMut::new();
    frames::put_deliver(&mut out, ch, consumer, tag, &msg, 4096);
    match frames::cut(&mut out, 1 << 20) {
        frames::Cut::Frame(method) => method,
        other => panic!("{other:?}"),
    }
}

fn settle(ch: u16, m: u16, tag: u64, multiple: bool) -> BytesMut {
    let mut out = BytesMut::new();
    frames::put_settle(&mut out, ch, m, tag, multiple, false);
    out
}

/// A connection logged in and open, channel 1 open with prefetch 10.
fn opened() -> Conn {
    let mut c = Conn::default();
    let start_ok = connection::StartOk {
        client_properties: FieldTable::default(),
        mechanism: ShortString::from("PLAIN"),
        response: LongString::from("\0guest\0guest"),
        locale: ShortString::from("en_US"),
    };
    let frames = [
        method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok)),
        ),
        method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: ShortString::from("/"),
            })),
        ),
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        ),
        method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                prefetch_count: 10,
                global: false,
            })),
        ),
    ];
    for f in &frames {
        assert!(matches!(c.client_sent(f), ToLeader::Forward));
    }
    let replies = [
        method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
        ),
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
        ),
        method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
        ),
    ];
    for mut f in replies {
        c.leader_sent(&mut f);
    }
    assert_eq!(c.user.as_deref(), Some("guest"));
    assert_eq!(c.vhost.as_deref(), Some("/"));
    c
}

fn consume(ch: u16, tag: &str, no_ack: bool) -> BytesMut {
    method(
        ch,
        AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
            queue: ShortString::from("s"),
            consumer_tag: ShortString::from(tag),
            no_local: false,
            no_ack,
            exclusive: false,
            nowait: false,
            arguments: FieldTable::default(),
        })),
    )
}

fn consume_ok(ch: u16, tag: &str) -> BytesMut {
    method(
        ch,
        AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
            consumer_tag: ShortString::from(tag),
        })),
    )
}

fn msg() -> crate::message::Message {
    crate::message::Message::new(b"", b"s", &[0, 0], b"m", Default::default())
}

/// The leader's tag in what an ack became, or None if it was dropped.
fn to_leader(c: &mut Conn, f: &[u8]) -> Option<(u64, bool)> {
    match c.client_sent(f) {
        ToLeader::Drop => None,
        ToLeader::Instead(b) => {
            let (_, m) = frames::method(&b)?;
            let (tag, multiple, _) = frames::settle_fields(&b, m)?;
            Some((tag, multiple))
        }
        ToLeader::Forward => Some((0, false)),
        ToLeader::Consume(_) => None,
    }
}

#[test]
fn a_stream_consume_is_offered_and_served_here() {
    let mut c = opened();
    let ToLeader::Consume(asked) = c.client_sent(&consume(1, "s1", false)) else {
        panic!("not offered");
    };
    assert!(c.may_serve(1, &asked.tag));
    assert!(c.start_local(1, &asked.tag, false).is_some());
    // consume-ok went to the client.
    assert_eq!(frames::method(&c.out), Some((60, 21)));
    // A tag in use, or a no-ack consume, is the leader's to refuse.
    assert!(!c.may_serve(1, "s1"));
    assert!(matches!(
        c.client_sent(&consume(1, "x", true)),
        ToLeader::Forward
    ));
}

#[test]
fn tags_are_shared_and_acks_split() {
    let mut c = opened();
    let (_, handle) = c.start_local(1, "s1", true).expect("served");
    assert_eq!(c.credit(1, "s1"), Some(10));
    // A classic consumer on the same channel, through the leader.
    c.client_sent(&consume(1, "c1", false));
    c.forward_consume(1, "c1", false, false);
    c.leader_sent(&mut consume_ok(1, "c1"));
    // Client tags 1 (here), 2 (leader's 1), 3 (here), 4 (leader's 2).
    assert!(c.deliver(1, "s1", &msg()));
    let mut d = deliver(1, "c1", 1);
    c.leader_sent(&mut d);
    assert_eq!(frames::deliver_tags(&d), Some((&b"c1"[..], 2)));
    assert!(c.deliver(1, "s1", &msg()));
    let mut d = deliver(1, "c1", 2);
    c.leader_sent(&mut d);
    assert_eq!(frames::deliver_tags(&d), Some((&b"c1"[..], 4)));
    assert_eq!(c.credit(1, "s1"), Some(8));
    // Ack 1 alone: here only.
    assert_eq!(to_leader(&mut c, &settle(1, frames::ACK, 1, false)), None);
    assert_eq!(c.credit(1, "s1"), Some(9));
    // Ack up to 3: the leader's 1, and credit for 3.
    assert_eq!(
        to_leader(&mut c, &settle(1, frames::ACK, 3, true)),
        Some((1, true))
    );
    assert_eq!(c.credit(1, "s1"), Some(10));
    // Reject 4: the leader's 2.
    assert_eq!(
        to_leader(&mut c, &settle(1, frames::REJECT, 4, false)),
        Some((2, false))
    );
    // An unknown tag: the leader refuses it.
    assert_eq!(
        to_leader(&mut c, &settle(1, frames::ACK, 4, false)),
        Some((u64::MAX, false))
    );
    // Cancelling the reader here is answered here.
    let cancel = method(
        1,
        AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: ShortString::from("s1"),
            nowait: false,
        })),
    );
    c.out.clear();
    assert!(matches!(c.client_sent(&cancel), ToLeader::Drop));
    assert_eq!(frames::method(&c.out), Some((60, 31)));
    assert!(handle.stopped());
    assert_eq!(c.credit(1, "s1"), None);
}

#[test]
fn a_channel_with_the_leaders_deliveries_or_an_answer_owed_is_not_served() {
    let mut c = opened();
    c.leader_sent(&mut deliver(1, "c1", 1));
    assert!(!c.may_serve(1, "s1"));
    let mut c = opened();
    let get = method(
        1,
        AMQPClass::Basic(basic::AMQPMethod::Get(basic::Get {
            queue: ShortString::from("q"),
            no_ack: true,
        })),
    );
    assert!(matches!(c.client_sent(&get), ToLeader::Forward));
    assert!(!matches!(
        c.client_sent(&consume(1, "s1", false)),
        ToLeader::Consume(_)
    ));
}

#[test]
fn no_ack_deliveries_of_the_leader_are_not_kept() {
    let mut c = opened();
    c.start_local(1, "s1", true).expect("served");
    c.client_sent(&consume(1, "auto", true));
    c.leader_sent(&mut consume_ok(1, "auto"));
    for t in 1..=3 {
        c.leader_sent(&mut deliver(1, "auto", t));
    }
    assert!(c.deliver(1, "s1", &msg()));
    // Ack everything: only the reader's delivery (tag 4) is outstanding.
    assert_eq!(to_leader(&mut c, &settle(1, frames::ACK, 0, true)), None);
    assert_eq!(c.credit(1, "s1"), Some(10));
}

#[test]
fn a_closed_channel_stops_its_readers() {
    let mut c = opened();
    let (_, handle) = c.start_local(1, "s1", true).expect("served");
    let close = method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
            reply_code: 406,
            reply_text: ShortString::from("x"),
            class_id: 0,
            method_id: 0,
        })),
    );
    let mut from_leader = close.clone();
    c.leader_sent(&mut from_leader);
    assert!(handle.stopped());
    assert!(!c.deliver(1, "s1", &msg()));
    c.client_sent(&close);
    assert_eq!(c.credit(1, "s1"), None);
}
