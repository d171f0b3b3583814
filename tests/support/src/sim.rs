//! A simulated GPU node in a temporary directory.

use std::path::{Path, PathBuf};

use gpuslice_simnode::NodeSpec;
pub use gpuslice_simnode::driver_root::proc_bus_id;
use gpuslice_simnode::driver_root::{self, Artefacts};

pub struct SimNode {
    dir: tempfile::TempDir,
    pub spec: NodeSpec,
}

impl SimNode {
    /// A node of `gpus` GPUs of `model`, with `memory` bytes each when given; each context
    /// takes what one takes on that model, as on a real card. Device nodes are created when
    /// the tests run as root.
    #[must_use]
    pub fn new(gpus: u32, model: &str, memory: Option<u64>) -> Self {
        Self::build(gpus, model, memory, |_| {})
    }

    /// As [`SimNode::new`], each context taking `context_bytes` of device memory.
    #[must_use]
    pub fn with_context_bytes(
        gpus: u32,
        model: &str,
        memory: Option<u64>,
        context_bytes: u64,
    ) -> Self {
        Self::build(gpus, model, memory, |g| g.context_bytes = context_bytes)
    }

    /// As [`SimNode::new`], the driver of each GPU reserving `reserved_bytes` for itself
    /// (NVML's `reserved`: part of the total no process is given).
    #[must_use]
    pub fn with_reserved_bytes(gpus: u32, model: &str, reserved_bytes: u64) -> Self {
        Self::build(gpus, model, None, |g| g.reserved_bytes = reserved_bytes)
    }

    /// As [`SimNode::new`], each kernel taking `ns_per_block` of simulated GPU time per
    /// thread block (and NVML reporting each process's SM utilization from that).
    #[must_use]
    pub fn with_kernel_time(
        gpus: u32,
        model: &str,
        memory: Option<u64>,
        ns_per_block: u64,
    ) -> Self {
        Self::build(gpus, model, memory, |g| {
            g.kernel_ns_per_block = ns_per_block
        })
    }

    /// As [`SimNode::with_kernel_time`], each memset also taking `memset_ns_per_kib` of
    /// simulated GPU time per KiB it sets.
    #[must_use]
    pub fn with_kernel_and_memset_time(
        gpus: u32,
        model: &str,
        ns_per_block: u64,
        memset_ns_per_kib: u64,
    ) -> Self {
        Self::build(gpus, model, None, |g| {
            g.kernel_ns_per_block = ns_per_block;
            g.memset_ns_per_kib = memset_ns_per_kib;
        })
    }

    /// As [`SimNode::new`], the GPUs connected as `layout` says (`pcie`, `nvlink-pairs`:
    /// [`NodeSpec::connect`]).
    #[must_use]
    pub fn with_layout(gpus: u32, model: &str, layout: &str) -> Self {
        Self::build_spec(gpus, model, None, |spec| {
            spec.connect(layout).expect("layout");
        })
    }

    /// As [`SimNode::new`], the node standing for NVIDIA driver `version` (`580.95.05`, or a
    /// branch: [`NodeSpec::set_driver`]).
    #[must_use]
    pub fn with_driver(gpus: u32, model: &str, version: &str) -> Self {
        Self::build_spec(gpus, model, None, |spec| {
            spec.set_driver(version).expect("driver version");
        })
    }

    fn build(
        gpus: u32,
        model: &str,
        memory: Option<u64>,
        each: impl Fn(&mut gpuslice_simnode::SimGpu),
    ) -> Self {
        Self::build_spec(gpus, model, memory, |spec| {
            for g in &mut spec.gpus {
                each(g);
            }
        })
    }

    fn build_spec(
        gpus: u32,
        model: &str,
        memory: Option<u64>,
        change: impl FnOnce(&mut NodeSpec),
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-sim-")
            .tempdir()
            .expect("tempdir");
        let spec = NodeSpec::uniform(model, gpus, memory, dir.path().join("run/gpuslice-sim"))
            .expect("model");
        let mut spec = spec;
        change(&mut spec);
        // SAFETY: geteuid has no preconditions.
        #[allow(unsafe_code)]
        let root = unsafe { libc::geteuid() } == 0;
        driver_root::create(
            dir.path(),
            &spec,
            &Artefacts::in_dir(&crate::target_dir()),
            root,
        )
        .expect("driver root");
        Self { dir, spec }
    }

    #[must_use]
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The runtime configuration (runtime.json) that selects this node.
    #[must_use]
    pub fn runtime_config(&self) -> serde_json::Value {
        driver_root::runtime_config(self.root(), &self.spec)
    }

    #[must_use]
    pub fn lib_dir(&self) -> PathBuf {
        self.root().join(driver_root::LIB_DIR)
    }

    /// A directory laid out as a GPU container's libraries are: the driver fronts under the
    /// driver libraries' sonames and development names, the interception library, and the node's fake driver
    /// libraries under their private names. A program run with it as `LD_LIBRARY_PATH` loads
    /// the driver as a container's program does.
    #[must_use]
    pub fn fronted_lib_dir(&self) -> PathBuf {
        use gpuslice_core::layout::{FRONTS, INTERCEPTION_LIBRARY_FILE};
        let dir = self.root().join("gpuslice-fronted");
        if dir.exists() {
            return dir;
        }
        // Made aside and renamed into place, so that concurrent callers all see it whole.
        let aside = tempfile::Builder::new()
            .prefix(".fronted-")
            .tempdir_in(self.root())
            .expect("fronted lib dir");
        let target = crate::target_dir();
        let link = |src: PathBuf, name: &str| {
            assert!(
                src.exists(),
                "{} is missing: run `cargo build --workspace`",
                src.display()
            );
            std::os::unix::fs::symlink(&src, aside.path().join(name)).expect("symlink");
        };
        link(
            target.join(INTERCEPTION_LIBRARY_FILE),
            INTERCEPTION_LIBRARY_FILE,
        );
        for f in FRONTS {
            // The front stands in for every name of the driver library, as in a container.
            link(target.join(f.file), f.soname);
            link(target.join(f.file), f.stem);
            link(self.lib_dir().join(f.soname), f.real);
        }
        if std::fs::rename(aside.path(), &dir).is_err() {
            assert!(dir.exists(), "{} could not be made", dir.display());
        }
        dir
    }

    /// The wall client (`shim/tests/c/wall.c`) linked against this node's driver (no
    /// interception library in front of it), built into the node's root.
    pub fn wall_client(&self) -> PathBuf {
        self.test_program("wall")
    }

    /// The test program `shim/tests/c/NAME.c` linked against this node's driver (no
    /// interception library in front of it), built into the node's root (built aside and
    /// renamed into place, so that a program running from there is never rewritten).
    pub fn test_program(&self, name: &str) -> PathBuf {
        let program = self.root().join(name);
        let aside = self.root().join(format!(
            ".{name}.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../shim/tests/c/{name}.c"));
        let ok = std::process::Command::new("gcc")
            .args(["-O1", "-o"])
            .arg(&aside)
            .arg(&src)
            .arg(format!("-L{}", self.lib_dir().display()))
            .args(["-lcuda", "-ldl"])
            .status()
            .expect("gcc (apt-get install gcc)")
            .success();
        assert!(ok, "building {}", src.display());
        std::fs::rename(&aside, &program).expect("test program into place");
        program
    }

    /// Runs the wall client `program` holding `bytes` of device memory, called plainly through
    /// this node's driver, until its stdin closes; returns once it holds them.
    pub fn hold(&self, program: &Path, bytes: u64) -> std::process::Child {
        let mut cmd = std::process::Command::new(program);
        cmd.args(["link", "hold", &bytes.to_string()])
            .env("LD_LIBRARY_PATH", self.lib_dir());
        let (child, line) = start_holding(cmd);
        assert!(line.contains("fit=CUDA_SUCCESS"), "{line}");
        child
    }

    /// Runs a process holding `bytes` of GPU `gpu`'s memory taken through the graphics driver
    /// (as an OpenGL or Vulkan program does: no CUDA, so no interception library sees it;
    /// `gpuslice-simnode hold-graphics`) until its stdin closes; returns once it holds them.
    pub fn hold_graphics(&self, gpu: usize, bytes: u64) -> std::process::Child {
        let mut cmd = std::process::Command::new(crate::binary("gpuslice-simnode"));
        cmd.arg("hold-graphics")
            .arg("--root")
            .arg(self.root())
            .args(["--gpu", &gpu.to_string(), "--bytes", &bytes.to_string()]);
        let (child, line) = start_holding(cmd);
        assert_eq!(line.trim(), format!("held={bytes}"));
        child
    }
}

/// Starts `cmd` with its stdin and stdout piped, and reads the first line it prints (a
/// holder prints it once it holds its memory; a test program, once it is set up).
pub fn start_holding(mut cmd: std::process::Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}
