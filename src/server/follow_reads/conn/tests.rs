//! A carried connection's renumbering and ack splitting, frame by frame.

use amq_protocol::protocol::{basic, channel, connection, AMQPClass};
use amq_protocol::types::{FieldTable, LongString, ShortString};
use bytes::BytesMut;

use super::*;
use crate::amqp::codec::put_method;
use crate::server::follow_reads::frames;

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
    for f in replies {
        c.leader_sent(f);
    }
    assert_eq!(c.user.as_deref(), Some("guest"));
    assert_eq!(c.vhost.as_deref(), Some("/"));
    c.out.clear();
    c
}

/// The leader's whole delivery `tag` to `consumer` on channel 1: its
/// method, header and one body frame.
fn leader_delivers(c: &mut Conn, consumer: &str, tag: u64) {
    c.leader_sent(deliver(1, consumer, tag));
    c.leader_sent(header(1, 1));
    c.leader_sent(body(1, 1));
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
        ToLeader::Consume(_) | ToLeader::End => None,
    }
}

/// The frames in `out` (taken): (channel, method ids or the frame type).
fn sent(c: &mut Conn) -> Vec<(u16, (u16, u16))> {
    let mut out = c.out.split();
    let mut got = Vec::new();
    while let frames::Cut::Frame(f) = frames::cut(&mut out, 1 << 20) {
        let what = frames::method(&f).unwrap_or((0, u16::from(frames::kind(&f))));
        got.push((frames::channel(&f), what));
    }
    got
}

/// The delivery tags of the basic.deliver frames in `out` (taken).
fn tags_sent(c: &mut Conn) -> Vec<u64> {
    let mut out = c.out.split();
    let mut got = Vec::new();
    while let frames::Cut::Frame(f) = frames::cut(&mut out, 1 << 20) {
        if frames::method(&f) == Some((60, 60)) {
            got.extend(frames::deliver_tags(&f).map(|(_, t)| t));
        }
    }
    got
}

/// A content header frame on `ch` announcing `size` body bytes, and one
/// body frame of `n` bytes.
fn header(ch: u16, size: u64) -> BytesMut {
    let mut out = BytesMut::new();
    crate::amqp::codec::put_content(&mut out, ch, &[0, 0], &vec![0; size as usize], 1 << 20);
    match frames::cut(&mut out, 1 << 20) {
        frames::Cut::Frame(h) => h,
        other => panic!("{other:?}"),
    }
}

fn body(ch: u16, n: usize) -> BytesMut {
    let mut out = BytesMut::new();
    crate::amqp::codec::put_content(&mut out, ch, &[0, 0], &vec![0; n], 1 << 20);
    let _header = frames::cut(&mut out, 1 << 20);
    match frames::cut(&mut out, 1 << 20) {
        frames::Cut::Frame(b) => b,
        other => panic!("{other:?}"),
    }
}

fn cancel(ch: u16, tag: &str) -> BytesMut {
    method(
        ch,
        AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: ShortString::from(tag),
            nowait: false,
        })),
    )
}

/// Channel 1 with reader "s1" served here (consume-ok sent), and a
/// classic consumer "c1" the leader serves.
fn mixed() -> (Conn, u64, Arc<Handle>) {
    let mut c = opened();
    let (id, handle) = c.start_local(1, "s1", false).expect("served");
    c.consumed(1, "s1", id);
    c.client_sent(&consume(1, "c1", false));
    c.forward_consume(1, "c1", false, false);
    c.leader_sent(consume_ok(1, "c1"));
    c.out.clear();
    (c, id, handle)
}

#[test]
fn a_stream_consume_is_offered_and_answered_once_placed() {
    let mut c = opened();
    let ToLeader::Consume(asked) = c.client_sent(&consume(1, "s1", false)) else {
        panic!("not offered");
    };
    assert!(c.may_serve(1, &asked.tag));
    let (id, _) = c.start_local(1, &asked.tag, false).expect("served");
    assert!(c.out.is_empty());
    c.consumed(1, "s1", id);
    assert_eq!(sent(&mut c), [(1, (60, 21))]);
    // A tag in use, or a no-ack consume, is not served here; a channel
    // at its consumer limit neither.
    assert!(!c.may_serve(1, "s1"));
    assert!(matches!(
        c.client_sent(&consume(1, "x", true)),
        ToLeader::Forward
    ));
    c.leader_sent(consume_ok(1, "x"));
    c.consumer_max = 2;
    assert!(!c.may_serve(1, "s2"));
    c.consumer_max = 3;
    assert!(c.may_serve(1, "s2"));
}

#[test]
fn tags_are_shared_and_acks_split() {
    let (mut c, id, handle) = mixed();
    assert_eq!(c.credit(1, "s1", id), Some(10));
    // Client tags 1 (here), 2 (leader's 1), 3 (here), 4 (leader's 2).
    assert!(c.deliver(1, "s1", id, &msg()));
    leader_delivers(&mut c, "c1", 1);
    assert!(c.deliver(1, "s1", id, &msg()));
    leader_delivers(&mut c, "c1", 2);
    assert_eq!(tags_sent(&mut c), [1, 2, 3, 4]);
    assert_eq!(c.credit(1, "s1", id), Some(8));
    // Ack 1 alone: here only.
    assert_eq!(to_leader(&mut c, &settle(1, frames::ACK, 1, false)), None);
    assert_eq!(c.credit(1, "s1", id), Some(9));
    // Ack up to 3: the leader's 1, and credit for 3.
    assert_eq!(
        to_leader(&mut c, &settle(1, frames::ACK, 3, true)),
        Some((1, true))
    );
    assert_eq!(c.credit(1, "s1", id), Some(10));
    // Reject 4: the leader's 2.
    assert_eq!(
        to_leader(&mut c, &settle(1, frames::REJECT, 4, false)),
        Some((2, false))
    );
    // Tags not held (acked already, never given, or a multiple ack
    // naming one): the leader refuses them as unknown, nothing settles.
    assert!(c.deliver(1, "s1", id, &msg()));
    for (tag, multiple) in [(4, false), (99, true), (0, false)] {
        let want = if tag == 0 { 0 } else { u64::MAX };
        assert_eq!(
            to_leader(&mut c, &settle(1, frames::ACK, tag, multiple)),
            Some((want, false))
        );
    }
    assert_eq!(c.credit(1, "s1", id), Some(9));
    // Cancelling the reader here is answered here.
    c.out.clear();
    assert!(matches!(c.client_sent(&cancel(1, "s1")), ToLeader::Drop));
    assert_eq!(sent(&mut c), [(1, (60, 31))]);
    assert!(handle.stopped());
    assert_eq!(c.credit(1, "s1", id), None);
}

#[test]
fn nothing_lands_inside_a_leader_message() {
    let (mut c, id, _) = mixed();
    // The leader's delivery arrives in parts.
    c.leader_sent(deliver(1, "c1", 1));
    c.leader_sent(header(1, 10));
    // A delivery made here, and a cancel-ok answered here, meanwhile
    // wait for the message's end.
    assert!(c.deliver(1, "s1", id, &msg()));
    let (id2, _) = c.start_local(1, "s2", true).expect("served");
    assert!(matches!(c.client_sent(&cancel(1, "s2")), ToLeader::Drop));
    c.leader_sent(body(1, 6));
    assert_eq!(sent(&mut c), [(1, (60, 60)), (1, (0, 2)), (1, (0, 3))]);
    c.leader_sent(body(1, 4));
    let after = [
        (1, (0, 3)),
        (1, (60, 60)),
        (1, (0, 2)),
        (1, (0, 3)),
        (1, (60, 31)),
    ];
    assert_eq!(sent(&mut c), after);
    assert_eq!(c.credit(1, "s2", id2), None);
    assert_eq!(c.credit(1, "s1", id), Some(9));
    // The leader's delivery took tag 1, the one made here tag 2.
    leader_delivers(&mut c, "c1", 2);
    assert!(c.deliver(1, "s1", id, &msg()));
    assert_eq!(tags_sent(&mut c), [3, 4]);
    // An empty body has a header and no body frame.
    c.leader_sent(deliver(1, "c1", 2));
    c.leader_sent(header(1, 0));
    assert!(c.deliver(1, "s1", id, &msg()));
}

#[test]
fn a_later_reader_under_the_same_tag_is_its_own() {
    let mut c = opened();
    let (old, old_handle) = c.start_local(1, "s1", false).expect("served");
    assert!(matches!(c.client_sent(&cancel(1, "s1")), ToLeader::Drop));
    let (new, _) = c.start_local(1, "s1", false).expect("served again");
    assert!(old_handle.stopped());
    assert_eq!(c.credit(1, "s1", old), None);
    assert!(!c.deliver(1, "s1", old, &msg()));
    c.cancel_local(1, "s1", old);
    assert_eq!(c.credit(1, "s1", new), Some(10));
}

#[test]
fn reusing_a_tag_served_here_closes_the_connection_as_rabbitmq_does() {
    let (mut c, _, handle) = mixed();
    assert!(matches!(
        c.client_sent(&consume(1, "s1", false)),
        ToLeader::Drop
    ));
    assert_eq!(sent(&mut c), [(0, (10, 50))]);
    assert!(handle.stopped());
    // Nothing passes until the client's close-ok ends it.
    c.leader_sent(deliver(1, "c1", 1));
    assert!(c.out.is_empty());
    assert!(matches!(
        c.client_sent(&settle(1, frames::ACK, 1, false)),
        ToLeader::Drop
    ));
    let close_ok = method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
    );
    assert!(matches!(c.client_sent(&close_ok), ToLeader::End));
}

#[test]
fn an_external_login_names_the_certificates_user() {
    let mut c = Conn::new(0, Some("O=client,CN=alice".into()));
    let start_ok = connection::StartOk {
        client_properties: FieldTable::default(),
        mechanism: ShortString::from("EXTERNAL"),
        response: LongString::from(""),
        locale: ShortString::from("en_US"),
    };
    let f = method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok)),
    );
    assert!(matches!(c.client_sent(&f), ToLeader::Forward));
    assert_eq!(c.user.as_deref(), Some("O=client,CN=alice"));
}

#[test]
fn past_the_consumer_limit_with_readers_here_the_connection_is_closed() {
    let (mut c, _, _) = mixed();
    c.consumer_max = 2;
    assert!(matches!(
        c.client_sent(&consume(1, "third", false)),
        ToLeader::Drop
    ));
    assert_eq!(sent(&mut c), [(0, (10, 50))]);
    // The client's own close crossing ours is answered, and ends it.
    let close = method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: 200,
            reply_text: ShortString::from("bye"),
            class_id: 0,
            method_id: 0,
        })),
    );
    assert!(matches!(c.client_sent(&close), ToLeader::End));
    assert_eq!(sent(&mut c), [(0, (10, 51))]);
}

#[test]
fn once_raw_nothing_is_read_or_answered() {
    let (mut c, id, handle) = mixed();
    c.go_raw();
    assert!(handle.stopped());
    assert!(matches!(c.client_sent(&cancel(1, "s1")), ToLeader::Forward));
    assert!(c.out.is_empty());
    assert!(!c.deliver(1, "s1", id, &msg()));
}

#[test]
fn recover_gives_the_credit_back() {
    let (mut c, id, _) = mixed();
    for _ in 0..10 {
        assert!(c.deliver(1, "s1", id, &msg()));
    }
    leader_delivers(&mut c, "c1", 1);
    assert_eq!(c.credit(1, "s1", id), Some(0));
    let recover = method(
        1,
        AMQPClass::Basic(basic::AMQPMethod::Recover(basic::Recover { requeue: true })),
    );
    assert!(matches!(c.client_sent(&recover), ToLeader::Forward));
    assert_eq!(c.credit(1, "s1", id), Some(10));
    assert_eq!(
        to_leader(&mut c, &settle(1, frames::ACK, 3, false)),
        Some((u64::MAX, false))
    );
}

#[test]
fn a_channel_with_the_leaders_deliveries_or_an_answer_owed_is_not_served() {
    let mut c = opened();
    c.leader_sent(deliver(1, "c1", 1));
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
    let (id, _) = c.start_local(1, "s1", false).expect("served");
    c.client_sent(&consume(1, "auto", true));
    c.leader_sent(consume_ok(1, "auto"));
    for t in 1..=3 {
        leader_delivers(&mut c, "auto", t);
    }
    assert!(c.deliver(1, "s1", id, &msg()));
    // Ack everything: only the reader's delivery (tag 4) is outstanding.
    assert_eq!(to_leader(&mut c, &settle(1, frames::ACK, 0, true)), None);
    assert_eq!(c.credit(1, "s1", id), Some(10));
}

#[test]
fn a_closed_channel_stops_its_readers() {
    let mut c = opened();
    let (id, handle) = c.start_local(1, "s1", false).expect("served");
    let close = method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
            reply_code: 406,
            reply_text: ShortString::from("x"),
            class_id: 0,
            method_id: 0,
        })),
    );
    c.leader_sent(close.clone());
    assert!(handle.stopped());
    assert!(!c.deliver(1, "s1", id, &msg()));
    c.client_sent(&close);
    assert_eq!(c.credit(1, "s1", id), None);
}

#[test]
fn a_second_start_ok_or_open_leaves_every_consume_to_the_leader() {
    let mut c = opened();
    let again = connection::StartOk {
        client_properties: FieldTable::default(),
        mechanism: ShortString::from("PLAIN"),
        response: LongString::from("\0admin\0wrong"),
        locale: ShortString::from("en_US"),
    };
    let f = method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::StartOk(again)),
    );
    assert!(matches!(c.client_sent(&f), ToLeader::Forward));
    assert_eq!((c.user.as_deref(), c.vhost.as_deref()), (None, None));
    assert!(!c.may_serve(1, "t"), "nothing served here any more");
    let mut c = opened();
    let open = |vhost: &str| {
        method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: ShortString::from(vhost),
            })),
        )
    };
    assert!(matches!(c.client_sent(&open("/secret")), ToLeader::Forward));
    assert_eq!(c.vhost, None);
    assert!(!c.may_serve(1, "t"));
}
