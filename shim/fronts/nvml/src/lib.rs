//! `libnvidia-ml.so.1` in a GPU container: no code, only the dynamic section written by `build.rs`
//! (soname `libnvidia-ml.so.1`; needs `libgpuslice.so`, then the real driver library as
//! `libgpuslice-driver-nvml.so.1`), so that the interception library stands in front of the
//! driver for every lookup and the driver's own functions are reached through it.
