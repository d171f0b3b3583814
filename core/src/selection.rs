//! Which GPUs a request may use beyond their room: the GPUs it names or avoids
//! (`gpuslice.io/devices`) and the GPU models it accepts or avoids (`gpuslice.io/gpu-model`).
//!
//! A model entry matches a GPU when its words appear, in order and next to each other, among
//! the words of the model name the node agent reads from NVML (words split at spaces, `-`,
//! `_` and `/`, compared without case): `A100` matches `NVIDIA A100-SXM4-80GB` and
//! `A100-SXM4` does too, but `A10` does not, nor does `SXM4-A100`. An entry written `!T4`
//! avoids what `T4` matches. A GPU is accepted when no avoid entry matches it and either no
//! use entry is given or one matches it.

use serde::{Deserialize, Serialize};

use crate::annotations::{AnnotationError, DeviceSelector, MAX_GPUS_PER_CONTAINER, is_gpu_uuid};

/// The GPU models a request accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelSelector {
    /// Entries as written (without `!`): a GPU must match one of them, when any is given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept: Vec<String>,
    /// Entries as written (without `!`): a GPU matching one of them is not used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
}

/// A list entry as written: whether it avoids (`!` before it), and what it names.
fn entry(raw: &str) -> (bool, &str) {
    let item = raw.trim();
    match item.strip_prefix('!') {
        Some(rest) => (true, rest.trim()),
        None => (false, item),
    }
}

/// Model names and entries are compared word by word, case aside.
fn words(s: &str) -> impl Iterator<Item = &str> {
    s.split([' ', '-', '_', '/']).filter(|w| !w.is_empty())
}

/// Whether the words of `entry` appear together, in order, among the words of `model`.
fn entry_matches(entry: &str, model: &str) -> bool {
    let want: Vec<&str> = words(entry).collect();
    let have: Vec<&str> = words(model).collect();
    !want.is_empty()
        && have.len() >= want.len()
        && have
            .windows(want.len())
            .any(|w| w.iter().zip(&want).all(|(a, b)| a.eq_ignore_ascii_case(b)))
}

impl ModelSelector {
    /// Accepts every model.
    #[must_use]
    pub fn is_any(&self) -> bool {
        self.accept.is_empty() && self.avoid.is_empty()
    }

    /// Whether a GPU whose model name is `model` may be used.
    #[must_use]
    pub fn accepts(&self, model: &str) -> bool {
        if self.avoid.iter().any(|e| entry_matches(e, model)) {
            return false;
        }
        self.accept.is_empty() || self.accept.iter().any(|e| entry_matches(e, model))
    }

    /// Reads annotation `key`'s value: comma-separated entries, `!` before those to avoid.
    pub fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        let mut out = Self::default();
        for raw in value.split(',') {
            let (avoid, name) = entry(raw);
            if words(name).next().is_none() {
                return Err(AnnotationError::new(
                    key,
                    value,
                    "empty entry in the model list (write model names such as A100 or !T4, comma-separated)",
                ));
            }
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || " -_/.".contains(c))
            {
                return Err(AnnotationError::new(
                    key,
                    value,
                    format!(
                        "{name:?} is not a GPU model name (letters, digits, spaces and - _ / . only)"
                    ),
                ));
            }
            let list = if avoid {
                &mut out.avoid
            } else {
                &mut out.accept
            };
            if list.iter().any(|e| e.eq_ignore_ascii_case(name)) {
                return Err(AnnotationError::new(
                    key,
                    value,
                    format!("model {name} is listed twice"),
                ));
            }
            list.push(name.to_string());
        }
        if let Some(both) = out
            .accept
            .iter()
            .find(|a| out.avoid.iter().any(|v| v.eq_ignore_ascii_case(a)))
        {
            return Err(AnnotationError::new(
                key,
                value,
                format!("model {both} is both asked for and avoided"),
            ));
        }
        Ok(out)
    }
}

/// The GPUs a device list names: those to use (the request gets exactly these) or those to
/// avoid (it gets any others). One list does not mix the two.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceList {
    pub named: Vec<DeviceSelector>,
    pub avoided: Vec<DeviceSelector>,
}

/// Reads annotation `key`'s value: comma-separated GPU indexes or `GPU-…` UUIDs, each with
/// `!` before it to avoid it instead.
pub fn parse_devices(key: &str, value: &str) -> Result<DeviceList, AnnotationError> {
    let mut out = DeviceList::default();
    for raw in value.split(',') {
        let (avoid, item) = entry(raw);
        if item.is_empty() {
            return Err(AnnotationError::new(
                key,
                value,
                "empty entry in the device list",
            ));
        }
        let sel = if let Ok(i) = item.parse::<u32>() {
            DeviceSelector::Index(i)
        } else if is_gpu_uuid(item) {
            DeviceSelector::Uuid(item.to_string())
        } else {
            return Err(AnnotationError::new(
                key,
                value,
                format!(
                    "{item:?} is neither a GPU index nor a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
                ),
            ));
        };
        if out
            .named
            .iter()
            .chain(&out.avoided)
            .any(|s| same_device(s, &sel))
        {
            return Err(AnnotationError::new(
                key,
                value,
                format!("device {item} is listed twice"),
            ));
        }
        if avoid {
            out.avoided.push(sel);
        } else {
            out.named.push(sel);
        }
    }
    if !out.named.is_empty() && !out.avoided.is_empty() {
        return Err(AnnotationError::new(
            key,
            value,
            "names GPUs to use and GPUs to avoid in one list: name only the GPUs to use, or only the ones to avoid (each with !)",
        ));
    }
    if out.named.len() > MAX_GPUS_PER_CONTAINER as usize {
        return Err(AnnotationError::new(
            key,
            value,
            format!("at most {MAX_GPUS_PER_CONTAINER} GPUs per container"),
        ));
    }
    Ok(out)
}

fn same_device(a: &DeviceSelector, b: &DeviceSelector) -> bool {
    match (a, b) {
        (DeviceSelector::Uuid(x), DeviceSelector::Uuid(y)) => x.eq_ignore_ascii_case(y),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_entry_matches_whole_words_in_order_without_case() {
        let m = |v: &str| ModelSelector::parse("gpuslice.io/gpu-model", v).unwrap();
        let a100 = "NVIDIA A100-SXM4-80GB";
        assert!(m("A100").accepts(a100));
        assert!(m("a100-sxm4").accepts(a100));
        assert!(m("A100 SXM4 80GB").accepts(a100));
        assert!(!m("A10").accepts(a100));
        assert!(!m("SXM4-A100").accepts(a100));
        assert!(m("A10").accepts("NVIDIA A10"));
        assert!(m("H100,A100").accepts(a100));
        assert!(!m("!A100").accepts(a100));
        assert!(m("!A100").accepts("Tesla T4"));
        assert!(!m("A100,!40GB").accepts("NVIDIA A100-PCIE-40GB"));
        assert!(m("A100,!40GB").accepts(a100));
        assert!(ModelSelector::default().accepts(a100));
        assert!(!m("A100").accepts(""));
    }

    #[test]
    fn a_bad_model_list_is_refused_naming_the_entry() {
        let e = |v: &str| ModelSelector::parse("gpuslice.io/gpu-model", v).unwrap_err();
        assert!(e("A100,,T4").reason.contains("empty entry"));
        assert!(e("!").reason.contains("empty entry"));
        assert!(e("A100;rm").reason.contains("\"A100;rm\""));
        assert!(e("T4,t4").reason.contains("listed twice"));
        assert!(e("T4,!T4").reason.contains("both asked for and avoided"));
        assert_eq!(e("T4,!T4").key, "gpuslice.io/gpu-model");
    }

    #[test]
    fn a_device_list_names_or_avoids_but_not_both() {
        let k = "gpuslice.io/devices";
        let l = parse_devices(k, "!0, !GPU-00000000-0000-4000-8000-000000000001").unwrap();
        assert!(l.named.is_empty());
        assert_eq!(l.avoided.len(), 2);
        let l = parse_devices(k, "1,0").unwrap();
        assert_eq!(
            l.named,
            vec![DeviceSelector::Index(1), DeviceSelector::Index(0)]
        );
        let e = parse_devices(k, "0,!1").unwrap_err();
        assert!(e.reason.contains("in one list"), "{e}");
        assert!(
            parse_devices(k, "0,!0")
                .unwrap_err()
                .reason
                .contains("twice")
        );
        assert!(
            parse_devices(k, "!")
                .unwrap_err()
                .reason
                .contains("empty entry")
        );
    }
}
