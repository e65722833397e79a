//! Replays the fuzz corpus (fuzz/corpus/<target>/, the seeds that found
//! something and a few made by hand) through the same entry points the
//! cargo-fuzz targets call (src/fuzz/), on the stable toolchain: every
//! input that once crashed the broker stays a regression test.

use crate::common;

use std::path::Path;

use common::panics;

fn replay(target: &str, run: fn(&[u8])) {
    // A panic in a broker task (connection) is caught by tokio: the hook
    // records it (see tests/common/panics.rs).
    panics::install();
    let before = panics::count();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let done = std::panic::catch_unwind(|| run(&data));
        assert!(done.is_ok(), "{target}: {} panicked", path.display());
        n += 1;
    }
    assert!(n > 0, "{target}: no corpus in {}", dir.display());
    let new = panics::since(before);
    assert!(
        new.is_empty(),
        "{target}: the broker panicked:\n{}",
        new.join("\n")
    );
}

#[test]
fn frame_cutter() {
    replay("frame_cutter", warren::fuzz::frame_cutter);
}

#[test]
fn publish_assembler() {
    replay("publish_assembler", warren::fuzz::publish_assembler);
}

#[test]
fn field_table() {
    replay("field_table", warren::fuzz::field_table);
}

#[test]
fn method_parser() {
    replay("method_parser", warren::fuzz::method_parser);
}

#[test]
fn connection() {
    replay("connection", warren::fuzz::connection);
}

#[test]
fn http_request() {
    replay("http_request", warren::fuzz::http_request);
}

#[test]
fn stream_connection() {
    replay("stream_connection", warren::fuzz::stream_connection);
}

#[test]
fn amqp10_message() {
    replay("amqp10_message", warren::fuzz::amqp10_message);
}
