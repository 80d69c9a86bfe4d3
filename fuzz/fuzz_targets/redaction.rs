//! `cargo fuzz run redaction`: see `hermes_fuzz::redaction` and fuzz/README.md.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hermes_fuzz::redaction(data));
