//! The NVIDIA container toolkit's environment conventions, read from a container's
//! environment as images and users set them: `NVIDIA_VISIBLE_DEVICES` (which GPUs) and
//! `NVIDIA_DRIVER_CAPABILITIES` (which parts of the driver). See `docs/runtime.md` for the rule
//! that turns them into a request on a gpuslice runtime.

/// Which GPUs the container asks for.
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Which parts of the driver the container needs.
pub const DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";

/// What `NVIDIA_VISIBLE_DEVICES` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Unset, empty or `void`: the toolkit does nothing for the container.
    Unset,
    /// `none`: the toolkit gives the driver's files but no GPU.
    None,
    /// `all`: every GPU of the node.
    All,
    /// Indexes or UUIDs, in the order written.
    List(Vec<String>),
}

impl VisibleDevices {
    /// Whether it asks for at least one GPU.
    #[must_use]
    pub fn asks_for_gpus(&self) -> bool {
        matches!(self, Self::All | Self::List(_))
    }
}

/// The value of `name` in an OCI `process.env` list (`KEY=value` entries). The last entry
/// wins, as in the toolkit, which reads the list into a map.
#[must_use]
pub fn lookup<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

/// `NVIDIA_VISIBLE_DEVICES` in `env`.
#[must_use]
pub fn visible_devices(env: &[String]) -> VisibleDevices {
    match lookup(env, VISIBLE_DEVICES).map(str::trim) {
        None | Some("" | "void") => VisibleDevices::Unset,
        Some("none") => VisibleDevices::None,
        Some("all") => VisibleDevices::All,
        Some(list) => VisibleDevices::List(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        ),
    }
}

/// A part of the driver, as `NVIDIA_DRIVER_CAPABILITIES` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    /// CUDA and OpenCL.
    Compute,
    /// NVML and `nvidia-smi`.
    Utility,
    /// Video encode and decode.
    Video,
    /// OpenGL, EGL, Vulkan.
    Graphics,
    /// The X driver's display parts.
    Display,
    /// 32-bit libraries.
    Compat32,
    /// NGX (DLSS).
    Ngx,
}

impl Capability {
    /// Every capability, as `all` names them.
    pub const ALL: [Self; 7] = [
        Self::Compute,
        Self::Utility,
        Self::Video,
        Self::Graphics,
        Self::Display,
        Self::Compat32,
        Self::Ngx,
    ];

    /// Its name in `NVIDIA_DRIVER_CAPABILITIES`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Utility => "utility",
            Self::Video => "video",
            Self::Graphics => "graphics",
            Self::Display => "display",
            Self::Compat32 => "compat32",
            Self::Ngx => "ngx",
        }
    }
}

/// A set of capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities(u8);

impl Capabilities {
    /// What the toolkit gives when the variable is unset or empty.
    pub const DEFAULT: Self = Self(1 << Capability::Compute as u8 | 1 << Capability::Utility as u8);

    /// Every capability.
    #[must_use]
    pub fn all() -> Self {
        Capability::ALL.into_iter().fold(Self(0), Self::with)
    }

    /// This set and `c`.
    #[must_use]
    pub fn with(self, c: Capability) -> Self {
        Self(self.0 | 1 << c as u8)
    }

    #[must_use]
    pub fn has(self, c: Capability) -> bool {
        self.0 & (1 << c as u8) != 0
    }
}

/// A value of `NVIDIA_DRIVER_CAPABILITIES` that names no capability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{DRIVER_CAPABILITIES}={value:?}: {word:?} is not a driver capability (one of compute, utility, video, graphics, display, compat32, ngx, or all)"
)]
pub struct UnknownCapability {
    pub value: String,
    pub word: String,
}

/// `NVIDIA_DRIVER_CAPABILITIES` in `env`: unset or empty is `compute,utility`, as in the
/// toolkit; `all` is every capability.
pub fn capabilities(env: &[String]) -> Result<Capabilities, UnknownCapability> {
    let value = lookup(env, DRIVER_CAPABILITIES).unwrap_or_default().trim();
    if value.is_empty() {
        return Ok(Capabilities::DEFAULT);
    }
    let mut set = Capabilities::default();
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "all" {
            return Ok(Capabilities::all());
        }
        let c = Capability::ALL
            .into_iter()
            .find(|c| c.name() == word)
            .ok_or_else(|| UnknownCapability {
                value: value.to_string(),
                word: word.to_string(),
            })?;
        set = set.with(c);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| (*e).to_string()).collect()
    }

    #[test]
    fn visible_devices_reads_as_the_toolkit_does() {
        let v = |e: &[&str]| visible_devices(&env(e));
        assert_eq!(v(&[]), VisibleDevices::Unset);
        assert_eq!(v(&["NVIDIA_VISIBLE_DEVICES="]), VisibleDevices::Unset);
        assert_eq!(v(&["NVIDIA_VISIBLE_DEVICES=void"]), VisibleDevices::Unset);
        assert_eq!(v(&["NVIDIA_VISIBLE_DEVICES=none"]), VisibleDevices::None);
        assert_eq!(v(&["NVIDIA_VISIBLE_DEVICES=all"]), VisibleDevices::All);
        assert_eq!(
            v(&["NVIDIA_VISIBLE_DEVICES=2, GPU-abc"]),
            VisibleDevices::List(vec!["2".into(), "GPU-abc".into()])
        );
        // The image's `all`, then the user's `1`: the later entry wins.
        assert_eq!(
            v(&[
                "NVIDIA_VISIBLE_DEVICES=all",
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=1"
            ]),
            VisibleDevices::List(vec!["1".into()])
        );
        // A variable whose name only begins the same is another variable.
        assert_eq!(v(&["NVIDIA_VISIBLE_DEVICES_X=all"]), VisibleDevices::Unset);
    }

    #[test]
    fn capabilities_default_to_compute_and_utility_and_all_means_every_one() {
        let c = |e: &[&str]| capabilities(&env(e)).unwrap();
        assert_eq!(c(&[]), Capabilities::DEFAULT);
        assert_eq!(c(&["NVIDIA_DRIVER_CAPABILITIES="]), Capabilities::DEFAULT);
        assert!(c(&[]).has(Capability::Compute) && c(&[]).has(Capability::Utility));
        assert!(!c(&[]).has(Capability::Video));
        let some = c(&["NVIDIA_DRIVER_CAPABILITIES=utility,video"]);
        assert!(some.has(Capability::Video) && some.has(Capability::Utility));
        assert!(!some.has(Capability::Compute));
        assert_eq!(
            c(&["NVIDIA_DRIVER_CAPABILITIES=compute,all"]),
            Capabilities::all()
        );
    }

    #[test]
    fn an_unknown_capability_is_named_in_the_error() {
        let e = capabilities(&env(&["NVIDIA_DRIVER_CAPABILITIES=compute,graphix"])).unwrap_err();
        assert_eq!(e.word, "graphix");
        assert!(
            e.to_string()
                .contains("NVIDIA_DRIVER_CAPABILITIES=\"compute,graphix\""),
            "{e}"
        );
    }
}
