include!("../link_front.rs");

fn main() {
    link_front("libnvidia-ml.so.1", "libgpuslice-driver-nvml.so.1");
}
