//! cargo fuzz run stream_connection: see warren::fuzz::stream_connection.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::stream_connection(data));
