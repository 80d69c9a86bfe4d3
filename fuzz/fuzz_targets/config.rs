//! `cargo fuzz run config`: see `hermes_fuzz::config` and fuzz/README.md.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hermes_fuzz::config(data));
