//! The per-container limits file: the agent writes it (root-owned, read-only in the
//! container), the interception library reads it once. Version 1 is line-oriented
//! `key=value` text so that it can be read without a parser dependency and by people:
//!
//! ```text
//! # gpuslice limits
//! version=1
//! container_id=web-1
//! gpus=1
//! gpu.0.uuid=GPU-00000000-0000-0000-0000-000000000000
//! gpu.0.memory_bytes=2147483648
//! gpu.0.cores=50
//! gpu.0.context_bytes=0
//! gpu.0.sm_window=0+50
//! ```
//!
//! Lines starting with `#` and blank lines are ignored. A reader refuses a version it does
//! not know. GPU positions (`gpu.N`) are the container's view, in the order of the claim;
//! the UUID ties each one to the driver's device. `context_bytes` (optional, default 0) is the
//! device memory the driver reserves for each CUDA context, charged to the slice once per
//! context because the driver takes it from the same card. `sm_window` (optional) is where in
//! each cycle of [`SM_CYCLE_MS`] the slice's kernels run: from `start` percent of the cycle,
//! for `len` percent (`start+len`).

use crate::claim::{Claim, GpuGrant};
pub use crate::claim::{SM_CYCLE_MS, SmWindow};

/// A GPU's fields as read so far: uuid, memory_bytes, cores, context_bytes, sm_window.
type PartialGpu = (
    Option<String>,
    Option<u64>,
    Option<u32>,
    Option<u64>,
    Option<SmWindow>,
);

pub const VERSION: u32 = 1;
/// File name inside the container's directory.
pub const FILE_NAME: &str = "limits";

/// The limits of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLimit {
    pub uuid: String,
    pub memory_bytes: u64,
    /// Percent of the SMs; 0 for no reserved share (not throttled).
    pub cores: u32,
    /// Device memory charged for each context a process creates on this GPU.
    pub context_bytes: u64,
    /// Where in each cycle the slice's kernels run (a share of the SMs given a window).
    pub window: Option<SmWindow>,
}

/// Everything the limits file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub container_id: String,
    pub gpus: Vec<GpuLimit>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("unsupported limits version {0} (this reader knows {VERSION})")]
    Version(u32),
    #[error("missing {0}")]
    Missing(String),
}

impl Limits {
    #[must_use]
    pub fn from_claim(claim: &Claim) -> Self {
        let gpu = |g: &GpuGrant| GpuLimit {
            uuid: g.uuid.clone(),
            memory_bytes: g.memory_bytes,
            cores: g.cores,
            context_bytes: 0,
            window: g.window,
        };
        Self {
            container_id: claim.container_id.clone(),
            gpus: claim.gpus.iter().map(gpu).collect(),
        }
    }

    #[must_use]
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = format!(
            "# gpuslice limits: written by gpuslice-agent, read by libgpuslice.so\nversion={VERSION}\ncontainer_id={}\ngpus={}\n",
            self.container_id,
            self.gpus.len()
        );
        for (i, g) in self.gpus.iter().enumerate() {
            let _ = write!(
                s,
                "gpu.{i}.uuid={}\ngpu.{i}.memory_bytes={}\ngpu.{i}.cores={}\ngpu.{i}.context_bytes={}\n",
                g.uuid, g.memory_bytes, g.cores, g.context_bytes
            );
            if let Some(w) = g.window {
                let _ = writeln!(s, "gpu.{i}.sm_window={}+{}", w.start, w.len);
            }
        }
        s
    }

    pub fn parse(text: &str) -> Result<Self, LimitsError> {
        let mut version = None;
        let mut container_id = None;
        let mut count: Option<usize> = None;
        let mut gpus: Vec<PartialGpu> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: &str| LimitsError::Line {
                line: n + 1,
                reason: reason.to_string(),
            };
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| bad("expected key=value"))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| bad("expected a number"));
            match key {
                "version" => {
                    let v = u32::try_from(num(value)?).map_err(|_| bad("version out of range"))?;
                    if v != VERSION {
                        return Err(LimitsError::Version(v));
                    }
                    version = Some(v);
                }
                "container_id" => container_id = Some(value.to_string()),
                "gpus" => {
                    let c = usize::try_from(num(value)?).map_err(|_| bad("too many GPUs"))?;
                    if c > 64 {
                        return Err(bad("too many GPUs"));
                    }
                    count = Some(c);
                    gpus.resize(c, (None, None, None, None, None));
                }
                _ => {
                    let rest = key.strip_prefix("gpu.").ok_or_else(|| bad("unknown key"))?;
                    let (idx, field) = rest.split_once('.').ok_or_else(|| bad("unknown key"))?;
                    let idx: usize = idx.parse().map_err(|_| bad("bad GPU position"))?;
                    let slot = gpus
                        .get_mut(idx)
                        .ok_or_else(|| bad("GPU position beyond `gpus`"))?;
                    match field {
                        "uuid" => slot.0 = Some(value.to_string()),
                        "memory_bytes" => slot.1 = Some(num(value)?),
                        "cores" => {
                            slot.2 = Some(
                                u32::try_from(num(value)?)
                                    .map_err(|_| bad("cores out of range"))?,
                            )
                        }
                        "context_bytes" => slot.3 = Some(num(value)?),
                        "sm_window" => {
                            let (start, len) = value
                                .split_once('+')
                                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                                .ok_or_else(|| bad("expected START+LEN, in percent"))?;
                            if len == 0 || u64::from(start) + u64::from(len) > 100 {
                                return Err(bad("a window must lie within the cycle"));
                            }
                            slot.4 = Some(SmWindow { start, len });
                        }
                        _ => return Err(bad("unknown key")),
                    }
                }
            }
        }
        version.ok_or_else(|| LimitsError::Missing("version".into()))?;
        let container_id =
            container_id.ok_or_else(|| LimitsError::Missing("container_id".into()))?;
        count.ok_or_else(|| LimitsError::Missing("gpus".into()))?;
        let gpus = gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| match g {
                (Some(uuid), Some(memory_bytes), cores, context_bytes, window) => Ok(GpuLimit {
                    uuid,
                    memory_bytes,
                    cores: cores.unwrap_or(0),
                    context_bytes: context_bytes.unwrap_or(0),
                    window,
                }),
                (None, ..) => Err(LimitsError::Missing(format!("gpu.{i}.uuid"))),
                (_, None, ..) => Err(LimitsError::Missing(format!("gpu.{i}.memory_bytes"))),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { container_id, gpus })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Limits {
        Limits {
            container_id: "web-1".into(),
            gpus: vec![
                GpuLimit {
                    uuid: "GPU-a".into(),
                    memory_bytes: 2 << 30,
                    cores: 50,
                    context_bytes: 300 << 20,
                    window: Some(SmWindow { start: 20, len: 50 }),
                },
                GpuLimit {
                    uuid: "GPU-b".into(),
                    memory_bytes: 1 << 30,
                    cores: 0,
                    context_bytes: 0,
                    window: None,
                },
            ],
        }
    }

    #[test]
    fn a_window_outside_the_cycle_or_malformed_is_refused_with_its_line() {
        let head = "version=1\ncontainer_id=a\ngpus=1\ngpu.0.uuid=GPU-a\ngpu.0.memory_bytes=1\n";
        for bad in ["80+30", "0+0", "50", "x+10"] {
            let text = format!("{head}gpu.0.sm_window={bad}\n");
            let err = Limits::parse(&text).unwrap_err();
            assert!(
                matches!(err, LimitsError::Line { line: 6, .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn rendered_limits_parse_back_to_the_same_value() {
        assert_eq!(Limits::parse(&sample().render()), Ok(sample()));
    }

    #[test]
    fn an_unknown_version_or_missing_field_is_refused() {
        assert_eq!(Limits::parse("version=2\n"), Err(LimitsError::Version(2)));
        let text = sample()
            .render()
            .replace("gpu.1.memory_bytes=1073741824\n", "");
        assert_eq!(
            Limits::parse(&text),
            Err(LimitsError::Missing("gpu.1.memory_bytes".into()))
        );
        assert!(matches!(
            Limits::parse("version=1\nbogus=1\n"),
            Err(LimitsError::Line { line: 2, .. })
        ));
    }
}
