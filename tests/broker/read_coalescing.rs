//! Read coalescing (src/amqp/coalesce.rs): a connection that streams
//! publishes is read in batches, with short pauses between reads. What a
//! client must still see: nothing lost or reordered, a synchronous method
//! right behind the stream answered, a message sent alone once the stream
//! has gone quiet delivered, and an orderly close completed.

use crate::common;

use std::time::Duration;

use amq_protocol::protocol::{connection, queue, AMQPClass};
use common::*;

/// Writes `n` 16-byte publishes to queue `q` on channel 1, 200 per write,
/// back to back: a stream far denser than the pause threshold. It starts
/// after a rest longer than the broker's hold-off after a synchronous
/// method (coalesce::HOLD), so the stream is read with pauses.
async fn stream(r: &mut raw::Raw, n: usize) {
    tokio::time::sleep(Duration::from_millis(150)).await;
    let one = raw::publish_message(1, "", "q", b"0123456789abcdef");
    let chunk = one.repeat(200);
    for _ in 0..n / 200 {
        r.send(&chunk).await;
    }
}

/// The message count queue.declare (passive) reports for `q`.
async fn count(r: &mut raw::Raw) -> u32 {
    r.send(&raw::queue_declare(1, "q", true, false, false))
        .await;
    match r.expect_method().await {
        (1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))) => ok.message_count,
        other => panic!("expected queue.declare-ok, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_publisher_loses_nothing_and_is_answered() {
    let b = start().await;
    let mut r = raw::Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "q", false, false, false))
        .await;
    r.expect_method().await;

    // A synchronous method straight behind the stream.
    stream(&mut r, 30_000).await;
    assert_eq!(count(&mut r).await, 30_000);

    // A lone message once the stream has gone quiet.
    stream(&mut r, 30_000).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    r.send(&raw::publish_message(1, "", "q", b"last")).await;
    assert_eq!(count(&mut r).await, 60_001);

    // An orderly close right behind another stream.
    stream(&mut r, 10_000).await;
    r.send(&raw::connection_close(200, "bye")).await;
    let (ch, m) = r.expect_method().await;
    assert_eq!(ch, 0);
    assert!(
        matches!(m, AMQPClass::Connection(connection::AMQPMethod::CloseOk(_))),
        "expected connection.close-ok, got {m:?}"
    );

    // Everything arrived, in order, the lone message where it was sent.
    let (_c, ch) = b.channel().await;
    let mut consumer = ch
        .basic_consume(
            "q".into(),
            "c".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    for i in 0..70_001 {
        let d = next(&mut consumer)
            .await
            .unwrap_or_else(|| panic!("delivery {i} did not arrive"));
        let want: &[u8] = if i == 60_000 {
            b"last"
        } else {
            b"0123456789abcdef"
        };
        assert_eq!(d.data, want, "delivery {i}");
    }
}
