#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| longhaul_fuzz_targets::repair(data));
