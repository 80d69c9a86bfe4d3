//! `cargo fuzz run pipeline`: see `hermes_fuzz::pipeline` and fuzz/README.md.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hermes_fuzz::pipeline(data));
