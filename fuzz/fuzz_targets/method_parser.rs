//! cargo fuzz run method_parser: see warren::fuzz::method_parser.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::method_parser(data));
