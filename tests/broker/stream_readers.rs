//! Stream readers beyond their start: filtering (x-stream-filter,
//! x-stream-match-unfiltered; Warren delivers exact matches only),
//! server-side offset tracking (x-stream-automatic-offset-tracking:
//! a reader resumes at its first unacked offset, across a cancel, a
//! restart and a kill -9), a reader far behind the tail with a small
//! prefetch, and a stream killed in the middle of a segment.

use crate::common;
use crate::helpers;
use crate::stream_support;

use std::time::Duration;

use common::child::ChildBroker;
use common::*;
use helpers::{declare_with, expect_code, s, table};
use lapin::{
    options::*,
    types::{AMQPValue, FieldArray, FieldTable},
};
use stream_support::*;

fn from_first(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut pairs = vec![("x-stream-offset", s("first"))];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

fn tracked(offset: Option<&str>) -> FieldTable {
    let mut pairs = vec![(
        "x-stream-automatic-offset-tracking",
        AMQPValue::Boolean(true),
    )];
    if let Some(o) = offset {
        pairs.push(("x-stream-offset", s(o)));
    }
    table(&pairs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_readers_get_exactly_what_they_ask_for() {
    let b = start().await;
    let (conn, ch) = b.channel().await;
    declare_with(
        &ch,
        "colours",
        durable(),
        stream(&[("x-stream-filter-size-bytes", AMQPValue::LongInt(32))]),
    )
    .await
    .expect("a stream with a filter size");
    publish_labelled(
        &ch,
        "colours",
        &[
            ("r1", Some("red")),
            ("b1", Some("blue")),
            ("n1", None),
            ("g1", Some("green")),
            ("r2", Some("red")),
            ("n2", None),
        ],
    )
    .await;

    let red = from_first(&[("x-stream-filter", s("red"))]);
    let (_a, mut a) = reader_with(&conn, "colours", "", 10, red).await.unwrap();
    assert_eq!(bodies_acking(&mut a, 2).await, ["r1", "r2"]);
    assert_no_delivery(&mut a).await;

    let two = AMQPValue::FieldArray(FieldArray::from(vec![s("red"), s("blue")]));
    let (_b, mut both) = reader_with(
        &conn,
        "colours",
        "",
        10,
        from_first(&[("x-stream-filter", two)]),
    )
    .await
    .unwrap();
    assert_eq!(bodies_acking(&mut both, 3).await, ["r1", "b1", "r2"]);

    let unfiltered = from_first(&[
        ("x-stream-filter", s("green")),
        ("x-stream-match-unfiltered", AMQPValue::Boolean(true)),
    ]);
    let (_c, mut c) = reader_with(&conn, "colours", "", 10, unfiltered)
        .await
        .unwrap();
    assert_eq!(bodies_acking(&mut c, 3).await, ["n1", "g1", "n2"]);

    // Without a filter a reader gets everything, labelled or not.
    let (_d, mut all) = reader_with(&conn, "colours", "", 10, from_first(&[]))
        .await
        .unwrap();
    assert_eq!(bodies_acking(&mut all, 6).await.len(), 6);

    // New messages reach the readers waiting at the end, filtered.
    publish_labelled(&ch, "colours", &[("b2", Some("blue")), ("r3", Some("red"))]).await;
    assert_eq!(bodies_acking(&mut a, 1).await, ["r3"]);
    assert_eq!(bodies_acking(&mut both, 2).await, ["b2", "r3"]);
    assert_no_delivery(&mut c).await;

    // A filter that is not a string or a list of strings is a 406.
    let bad = from_first(&[("x-stream-filter", AMQPValue::LongLongInt(1))]);
    let got = expect_code(reader_with(&conn, "colours", "", 10, bad).await, 406);
    assert!(got.contains("invalid x-stream-filter"), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_matches_little_reads_a_long_stream_through() {
    let b = start().await;
    let (conn, ch) = b.channel().await;
    declare_stream(&ch, "sparse").await;
    // Far more than one delivery round passes over (4,096), then the
    // only match.
    let mut messages: Vec<(String, Option<&str>)> = (0..20_000)
        .map(|i| (format!("n{i}"), Some("noise")))
        .collect();
    messages.push(("wanted".into(), Some("signal")));
    let refs: Vec<(&str, Option<&str>)> = messages.iter().map(|(b, v)| (b.as_str(), *v)).collect();
    publish_labelled(&ch, "sparse", &refs).await;
    let args = from_first(&[("x-stream-filter", s("signal"))]);
    let (_r, mut c) = reader_with(&conn, "sparse", "", 1, args).await.unwrap();
    let got = read_acking(&mut c, 1).await;
    assert_eq!(got, [(20_000, "wanted".to_string())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_far_behind_with_a_small_prefetch_reads_everything_in_order() {
    let b = start().await;
    let (conn, ch) = b.channel().await;
    declare_stream(&ch, "behind").await;
    // 10 MiB of 4 KiB bodies: the first 2 MiB are read back from the log.
    let body = "z".repeat(4096);
    publish_confirmed(&ch, "behind", (0..2560).map(|i| format!("{i}:{body}"))).await;
    let (_r, mut c) = reader(&conn, "behind", 1, Some(s("first"))).await;
    for i in 0..2560i64 {
        let d = next(&mut c).await.unwrap_or_else(|| panic!("offset {i}"));
        assert_eq!(offset_of(&d), i);
        assert!(d.data.starts_with(format!("{i}:").as_bytes()));
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracked_reader_resumes_at_its_first_unacked_offset() {
    let mut b = start().await;
    let (conn, ch) = b.channel().await;
    declare_stream(&ch, "tracked").await;
    publish_confirmed(&ch, "tracked", (0..20).map(|i| format!("m{i}"))).await;

    // Tracking needs a tag the client chose.
    let got = expect_code(
        reader_with(&conn, "tracked", "", 10, tracked(None)).await,
        406,
    );
    assert!(got.contains("needs a consumer tag"), "{got}");
    let bad = table(&[(
        "x-stream-automatic-offset-tracking",
        AMQPValue::LongLongInt(1),
    )]);
    expect_code(reader_with(&conn, "tracked", "t", 10, bad).await, 406);
    // Names starting with a NUL are the stream protocol's (a publisher's
    // sequence is kept as "\0publisher\0<reference>").
    let got = expect_code(
        reader_with(&conn, "tracked", "\0publisher\0app", 10, tracked(None)).await,
        406,
    );
    assert!(got.contains("NUL"), "{got}");

    // The first attach starts where x-stream-offset says.
    let (rch, mut c) = reader_with(&conn, "tracked", "app-1", 10, tracked(Some("first")))
        .await
        .unwrap();
    // A second reader tracked under the same tag would write its place
    // over the first's.
    let got = expect_code(
        reader_with(&conn, "tracked", "app-1", 10, tracked(Some("first"))).await,
        406,
    );
    assert!(got.contains("already reads"), "{got}");
    let mut held = Vec::new();
    for i in 0..10 {
        let d = next(&mut c).await.expect("delivery");
        assert_eq!(offset_of(&d), i);
        // Offset 6 is left unacked; 7 to 9 are acked after it.
        if i == 6 {
            held.push(d);
        } else {
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
    }
    rch.basic_cancel("app-1".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    // Attached again (x-stream-offset is what a first attach uses; this
    // one resumes): from 6, the first offset not acked.
    let (rch, mut c) = reader_with(&conn, "tracked", "app-1", 10, tracked(Some("last")))
        .await
        .unwrap();
    let again = read_acking(&mut c, 14).await;
    assert_eq!(again, numbered(6..20));
    drop(held);
    rch.close(200, "done".into()).await.unwrap();

    // Another tag is tracked apart: its first attach starts at next.
    let (_o, mut other) = reader_with(&conn, "tracked", "app-2", 10, tracked(None))
        .await
        .unwrap();
    assert_no_delivery(&mut other).await;
    drop(conn);

    // What was tracked survives a restart.
    b.restart().await;
    let (conn, ch) = b.channel().await;
    publish_confirmed(&ch, "tracked", ["m20".to_string()]).await;
    let (_r, mut c) = reader_with(&conn, "tracked", "app-1", 10, tracked(Some("first")))
        .await
        .unwrap();
    assert_eq!(read_acking(&mut c, 1).await, numbered(20..21));
    let (_u, mut untracked) = reader_with(&conn, "tracked", "app-1b", 10, from_first(&[]))
        .await
        .unwrap();
    assert_eq!(read_acking(&mut untracked, 1).await, numbered(0..1));
}

/// kill -9 while a publisher appends in the middle of a segment and a
/// tracked reader acks: after the restart every confirmed message is at
/// its offset, the offsets have no gap, new messages follow on, and the
/// tracked reader resumes no later than its first unacked offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_in_the_middle_of_a_segment_loses_no_confirmed_message() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, log) = (tmp.path().join("data"), tmp.path().join("warren.log"));
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let args = stream(&[(
        "x-stream-max-segment-size-bytes",
        AMQPValue::LongLongInt(1 << 20),
    )]);
    declare_with(&ch, "killed", durable(), args)
        .await
        .expect("declared");
    let body = "k".repeat(1000);
    publish_confirmed(&ch, "killed", (0..100).map(|i| format!("{i}:{body}"))).await;

    // A tracked reader acks the first 50, then holds 50 and 51.
    let (_r, mut c) = reader_with(&conn, "killed", "keeper", 100, tracked(Some("first")))
        .await
        .unwrap();
    let mut held = Vec::new();
    for i in 0..52 {
        let d = next(&mut c).await.expect("delivery");
        assert_eq!(offset_of(&d), i);
        if i < 50 {
            d.ack(BasicAckOptions::default()).await.unwrap();
        } else {
            held.push(d);
        }
    }
    // The tracked offset is written before the next commit: a confirmed
    // publish after the acks covers it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish_confirmed(&ch, "killed", (100..200).map(|i| format!("{i}:{body}"))).await;

    // Publishing goes on (pipelined confirms) when the kill comes.
    let publisher = {
        let ch = conn.create_channel().await.unwrap();
        let body = body.clone();
        tokio::spawn(async move {
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .unwrap();
            let mut confirmed = 200u64;
            for i in 200u64.. {
                let Ok(c) = ch
                    .basic_publish(
                        "".into(),
                        "killed".into(),
                        BasicPublishOptions::default(),
                        format!("{i}:{body}").as_bytes(),
                        lapin::BasicProperties::default(),
                    )
                    .await
                else {
                    break;
                };
                match c.await {
                    Ok(conf) if conf.is_ack() => confirmed = i + 1,
                    _ => break,
                }
            }
            confirmed
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    broker.kill();
    let confirmed = publisher.await.unwrap();
    drop(held);
    drop(broker);
    assert!(confirmed > 200, "the publisher got on: {confirmed}");

    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let (_r, mut all) = reader(&conn, "killed", 500, Some(s("first"))).await;
    for i in 0..confirmed as i64 {
        let d = next(&mut all)
            .await
            .unwrap_or_else(|| panic!("offset {i} is gone"));
        assert_eq!(offset_of(&d), i);
        assert!(d.data.starts_with(format!("{i}:").as_bytes()), "offset {i}");
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    // Whatever else got in before the kill follows without a gap.
    let mut kept = confirmed as i64;
    while let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(500), next(&mut all)).await {
        assert_eq!(offset_of(&d), kept);
        kept += 1;
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    let ch = conn.create_channel().await.unwrap();
    publish_confirmed(&ch, "killed", ["after".to_string()]).await;
    let d = next(&mut all).await.expect("the new message");
    assert_eq!((offset_of(&d), &d.data[..]), (kept, &b"after"[..]));

    let (_t, mut t) = reader_with(&conn, "killed", "keeper", 10, tracked(Some("last")))
        .await
        .unwrap();
    assert_eq!(read_acking(&mut t, 1).await[0].0, 50);
}

/// After a restart the stream keeps one time mark per segment of what it
/// read back; a reader that starts at a time still starts at the first
/// message stored in that second or later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_starts_at_a_time_in_what_a_restart_read_back() {
    let mut b = start().await;
    let (_c, ch) = b.channel().await;
    let args = stream(&[(
        "x-stream-max-segment-size-bytes",
        AMQPValue::LongLongInt(1000),
    )]);
    declare_with(&ch, "timed", durable(), args)
        .await
        .expect("declared");
    let body = "t".repeat(95);
    publish_confirmed(&ch, "timed", (0..25).map(|i| format!("{i:04}:{body}"))).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    publish_confirmed(&ch, "timed", (25..50).map(|i| format!("{i:04}:{body}"))).await;
    b.restart().await;
    let conn = b.connect().await;
    let (_r, mut c) = reader(&conn, "timed", 10, Some(AMQPValue::Timestamp(since))).await;
    assert_eq!(read_acking(&mut c, 1).await[0].0, 25);
    let (_r, mut all) = reader(
        &conn,
        "timed",
        100,
        Some(AMQPValue::Timestamp(since - 3600)),
    )
    .await;
    assert_eq!(read_acking(&mut all, 50).await.last().unwrap().0, 49);
}
