//! `cargo fuzz run wire`: see `hermes_fuzz::wire` and fuzz/README.md.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hermes_fuzz::wire(data));
