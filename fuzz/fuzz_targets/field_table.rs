//! cargo fuzz run field_table: see warren::fuzz::field_table.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::field_table(data));
