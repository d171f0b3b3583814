include!("../link_front.rs");

fn main() {
    link_front("libcuda.so.1", "libgpuslice-driver-cuda.so.1");
}
