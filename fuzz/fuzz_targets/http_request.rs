//! cargo fuzz run http_request: see warren::fuzz::http_request.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::http_request(data));
