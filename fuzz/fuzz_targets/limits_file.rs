//! Any limits file is read without a panic, and one that is accepted renders back to itself.
#![no_main]

use gpuslice_core::limits::Limits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(limits) = Limits::parse(text) {
        let again = Limits::parse(&limits.render()).expect("a rendered limits file parses");
        assert_eq!(again, limits);
    }
});
