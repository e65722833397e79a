use bytes::{BufMut, BytesMut};

use super::*;

fn response(key: u16, correlation: u32, code: u16, rest: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut o = BytesMut::new();
    wire::response(&mut o, key, correlation, code, rest);
    o.freeze()
}

fn pairs(f: &[u8]) -> Vec<(String, String)> {
    let mut fields = Fields::new(&f[4..]);
    let _ = (fields.u16(), fields.u16(), fields.u32(), fields.u16());
    let p = fields.pairs().unwrap();
    p.into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn frames_are_cut_whole_and_bounded() {
    let mut buf = BytesMut::new();
    buf.put_u32(3);
    buf.put_slice(&[1, 2]);
    assert_eq!(cut(&mut buf, 16), Ok(None), "partial");
    buf.put_slice(&[3, 9, 9]);
    let f = cut(&mut buf, 16).unwrap().unwrap();
    assert_eq!(&f[..], &[0, 0, 0, 3, 1, 2, 3]);
    assert_eq!(&buf[..], &[9, 9], "the rest kept");
    let mut big = BytesMut::new();
    big.put_u32(17);
    assert_eq!(cut(&mut big, 16), Err(17));
}

#[test]
fn the_open_response_names_this_node_and_keeps_the_rest() {
    let shared = Shared::default();
    shared.lock().opening = Some((3, "/".into()));
    let leader = response(OPEN, 3, OK, |o| {
        wire::put_pairs(
            o,
            [
                ("advertised_host", "leader"),
                ("advertised_port", "5552"),
                ("other", "x"),
            ]
            .into_iter(),
        )
    });
    let own = ("follower".to_string(), 6000);
    let f = leader_sent(&shared, leader, Some(&own));
    let mut got = pairs(&f);
    got.sort();
    let want = [
        ("advertised_host", "follower"),
        ("advertised_port", "6000"),
        ("other", "x"),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(shared.lock().vhost.as_deref(), Some("/"), "opened");
}

#[test]
fn a_user_and_a_vhost_count_once_the_leader_accepts_them() {
    let shared = Shared::default();
    shared.lock().claimed = Some((2, "guest".into()));
    leader_sent(
        &shared,
        response(SASL_AUTHENTICATE, 2, AUTHENTICATION_FAILURE, |_| {}),
        None,
    );
    assert_eq!(shared.lock().user, None, "refused");
    shared.lock().claimed = Some((4, "guest".into()));
    leader_sent(&shared, response(SASL_AUTHENTICATE, 4, OK, |_| {}), None);
    assert_eq!(shared.lock().user.as_deref(), Some("guest"));
    shared.lock().opening = Some((5, "nope".into()));
    let refused = response(OPEN, 5, VIRTUAL_HOST_ACCESS_FAILURE, |_| {});
    let f = leader_sent(&shared, refused.clone(), Some(&("me".into(), 1)));
    assert_eq!(f, refused, "a refusal passes as it is");
    assert_eq!(shared.lock().vhost, None);
}

#[test]
fn a_subscription_the_leader_refused_frees_its_id() {
    let shared = Shared::default();
    {
        let mut st = shared.lock();
        remote(&mut st, 7, 1);
        remote(&mut st, 8, 2);
        remote(&mut st, 9, 3);
    }
    leader_sent(
        &shared,
        response(SUBSCRIBE, 7, STREAM_DOES_NOT_EXIST, |_| {}),
        None,
    );
    leader_sent(&shared, response(SUBSCRIBE, 8, OK, |_| {}), None);
    let taken = SUBSCRIPTION_ID_ALREADY_EXISTS;
    leader_sent(&shared, response(SUBSCRIBE, 9, taken, |_| {}), None);
    let st = shared.lock();
    let mut held: Vec<u8> = st.remote.iter().copied().collect();
    held.sort_unstable();
    assert_eq!(held, vec![2, 3]);
    assert!(st.asked_remote.is_empty());
}

#[test]
fn sasl_names_plain_and_external_users() {
    let auth = |mechanism: &str, data: &[u8]| {
        let mut o = BytesMut::new();
        o.put_u32(11);
        wire::put_str(&mut o, mechanism);
        o.put_u32(data.len() as u32);
        o.put_slice(data);
        o
    };
    let plain = auth("PLAIN", b"\0alice\0secret");
    assert_eq!(
        sasl_user(&mut Fields::new(&plain), None),
        Some((11, "alice".into()))
    );
    let short = auth("PLAIN", b"\0alice");
    assert_eq!(sasl_user(&mut Fields::new(&short), None), None);
    let external = auth("EXTERNAL", b"");
    let f = || Fields::new(&external);
    assert_eq!(sasl_user(&mut f(), Some("cn")), Some((11, "cn".into())));
    assert_eq!(sasl_user(&mut f(), None), None, "no certificate, no user");
    let other = auth("AMQPLAIN", b"");
    assert_eq!(sasl_user(&mut Fields::new(&other), Some("cn")), None);
}

/// A client frame: key, version 1, then `body`.
fn client_frame(key: u16, body: impl FnOnce(&mut BytesMut)) -> BytesMut {
    let mut o = BytesMut::new();
    wire::frame(&mut o, key, 1, body);
    o
}

fn sent(st: &mut State, f: &BytesMut, external: Option<&str>) -> bool {
    let mut fields = Fields::new(&f[4..]);
    let _ = (fields.u16(), fields.u16());
    handshake_sent(st, u16::from_be_bytes([f[4], f[5]]), &mut fields, external)
}

fn plain(correlation: u32, user: &str) -> BytesMut {
    client_frame(SASL_AUTHENTICATE, |o| {
        o.put_u32(correlation);
        wire::put_str(o, "PLAIN");
        let data = format!("\0{user}\0pw");
        o.put_u32(data.len() as u32);
        o.put_slice(data.as_bytes());
    })
}

fn open(correlation: u32, vhost: &str) -> BytesMut {
    client_frame(OPEN, |o| {
        o.put_u32(correlation);
        wire::put_str(o, vhost);
    })
}

#[test]
fn a_second_login_or_open_is_never_taken_for_the_first() {
    // Pipelined: the leader's answers to the first login and open come
    // after the carrier read the second ones.
    let shared = Shared::default();
    {
        let mut st = shared.lock();
        assert!(sent(&mut st, &plain(3, "alice"), None));
        let tune = client_frame(TUNE | RESPONSE, |o| {
            o.put_u32(4096);
            o.put_u32(60);
        });
        assert!(sent(&mut st, &tune, None));
        assert_eq!(st.frame_max, 4096);
        assert!(sent(&mut st, &open(4, "/"), None));
        assert!(sent(&mut st, &open(4, "/secret"), None));
        assert!(sent(&mut st, &plain(3, "admin"), None));
    }
    leader_sent(&shared, response(SASL_AUTHENTICATE, 3, OK, |_| {}), None);
    leader_sent(&shared, response(OPEN, 4, OK, |_| {}), None);
    let st = shared.lock();
    assert!(st.spoiled);
    assert_eq!((st.user.as_deref(), st.vhost.as_deref()), (None, None));
}

#[test]
fn a_tune_after_the_open_changes_nothing() {
    let mut st = State::default();
    let tune = |max: u32| {
        client_frame(TUNE, |o| {
            o.put_u32(max);
            o.put_u32(0);
        })
    };
    assert!(sent(&mut st, &tune(8192), None));
    assert!(sent(&mut st, &open(1, "/"), None));
    assert!(sent(&mut st, &tune(1 << 30), None));
    assert_eq!(st.frame_max, 8192);
    assert!(!st.spoiled);
}

#[test]
fn an_unsubscribed_id_is_freed_by_the_leaders_answer() {
    let shared = Shared::default();
    {
        let mut st = shared.lock();
        remote(&mut st, 1, 5);
        st.unsubscribing.insert(2, 5);
    }
    leader_sent(&shared, response(SUBSCRIBE, 1, OK, |_| {}), None);
    assert!(shared.lock().remote.contains(&5), "held until unsubscribed");
    leader_sent(&shared, response(UNSUBSCRIBE, 2, OK, |_| {}), None);
    assert!(!shared.lock().remote.contains(&5));
}
