//! Any set of annotations (one `key=value` per line) is read without a panic, and a request
//! it yields is one the fit model can weigh.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let annotations: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Ok(Some(request)) = gpuslice_core::annotations::parse(&annotations) {
        assert!(
            request.gpus >= 1,
            "a request asks for at least one GPU: {request:?}"
        );
        if let Some(c) = request.cores {
            assert!(c <= 100, "cores beyond 100 accepted: {request:?}");
        }
    }
});
