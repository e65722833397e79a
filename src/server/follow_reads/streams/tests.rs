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
