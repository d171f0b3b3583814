//! Any module image a tenant hands the driver, fat binaries with compressed entries included,
//! is read without a panic, the globals read alone are the ones read with the kernels, and
//! reading the kernels' parameters changes nothing else.
#![no_main]

use gpuslice_cuda_abi::image;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for arch in [None, Some(75), Some(86), Some(90)] {
        let contents = image::contents(data, || arch);
        assert_eq!(image::globals(data, || arch), contents.globals);
        let with_params = image::contents_with_params(data, || arch);
        assert_eq!(with_params.globals, contents.globals);
        assert_eq!(with_params.kernel_locals, contents.kernel_locals);
    }
});
