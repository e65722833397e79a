//! cargo fuzz run amqp10_message: see warren::fuzz::amqp10_message.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren::fuzz::amqp10_message(data));
