//! cargo fuzz run publish_assembler: see warren::fuzz::publish_assembler.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::publish_assembler(data));
