//! cargo fuzz run connection: see warren::fuzz::connection.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::connection(data));
