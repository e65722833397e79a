//! cargo fuzz run frame_cutter: see warren::fuzz::frame_cutter.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::frame_cutter(data));
