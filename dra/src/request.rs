//! The slices one request of a ResourceClaim asks for on this node: its device results, each
//! `gpu-<index>` consuming `memory` and `cores` of it (consumable capacity, KEP-5075), or,
//! without consumed capacity, the whole GPU. A slice gives each of its GPUs the same memory
//! and share, so the GPUs the request consumes the same of (all of them, for a request for
//! `count: 2`) are one slice, and GPUs it consumes other amounts of are a slice each; a GPU
//! given to the request more than once (a device that allows several allocations) gives its
//! slice the sum of what they consume there.

use gpuslice_core::quantity::{self, MemoryQuantity};
use serde_json::Value;

/// Why a request's results cannot make slices. Each names the result by its position in the
/// claim's `status.allocation.devices.results`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("result {n}: device {device:?} is not one this driver publishes (gpu-<index>)")]
    Device { n: usize, device: String },
    #[error("result {n}: consumedCapacity {name}={value:?}: {reason}")]
    Capacity {
        n: usize,
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error(
        "result {n}: gpu-{index} is given to the request again, and one of the two has it whole"
    )]
    WholeTwice { n: usize, index: u32 },
}

/// What a request consumes of one GPU: `memory` None for the whole GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Consumed {
    pub memory: Option<u64>,
    pub cores: Option<u32>,
}

/// GPUs of one request it consumes the same of: one slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceOfRequest {
    /// In the order of their first result.
    pub indexes: Vec<u32>,
    pub consumed: Consumed,
    /// The position of the slice's first result among the claim's results.
    pub first: usize,
}

impl SliceOfRequest {
    /// The slices of `results` (each with its position in the claim's results), in the order
    /// of their first result.
    pub fn of(results: &[(usize, &Value)]) -> Result<Vec<Self>, RequestError> {
        // Each GPU, with what the request consumes of it and its first result.
        let mut gpus: Vec<(u32, Consumed, usize)> = Vec::new();
        for &(n, result) in results {
            let index = device_index(n, result)?;
            let consumed = consumed(n, result)?;
            match gpus.iter_mut().find(|(i, ..)| *i == index) {
                None => gpus.push((index, consumed, n)),
                Some((_, had, _)) => {
                    let (Some(a), Some(b)) = (had.memory, consumed.memory) else {
                        return Err(RequestError::WholeTwice { n, index });
                    };
                    had.memory = Some(a.checked_add(b).ok_or_else(|| RequestError::Capacity {
                        n,
                        name: "memory",
                        value: b.to_string(),
                        reason: "with the request's other results on this GPU, too large".into(),
                    })?);
                    had.cores = match (had.cores, consumed.cores) {
                        (Some(a), Some(b)) => Some(a.saturating_add(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        let mut slices: Vec<Self> = Vec::new();
        for (index, consumed, n) in gpus {
            match slices.iter_mut().find(|s| s.consumed == consumed) {
                Some(s) => s.indexes.push(index),
                None => slices.push(Self {
                    indexes: vec![index],
                    consumed,
                    first: n,
                }),
            }
        }
        Ok(slices)
    }
}

/// The index of the GPU result `n` names (`gpu-<index>`).
pub(crate) fn device_index(n: usize, result: &Value) -> Result<u32, RequestError> {
    let device = result["device"].as_str().unwrap_or_default();
    device
        .strip_prefix("gpu-")
        .and_then(|i| i.parse::<u32>().ok())
        .ok_or_else(|| RequestError::Device {
            n,
            device: device.to_string(),
        })
}

fn consumed(n: usize, result: &Value) -> Result<Consumed, RequestError> {
    let capacity = &result["consumedCapacity"];
    let memory = match capacity["memory"].as_str() {
        None => None,
        Some(value) => {
            let bad = |reason: String| RequestError::Capacity {
                n,
                name: "memory",
                value: value.to_string(),
                reason,
            };
            match quantity::parse_memory(value).map_err(|e| bad(e.to_string()))? {
                MemoryQuantity::Bytes(b) => Some(b),
                MemoryQuantity::PercentBasisPoints(_) => {
                    return Err(bad("a consumed capacity is a size, not a share".into()));
                }
            }
        }
    };
    let cores = match capacity["cores"].as_str() {
        None => None,
        Some(value) => Some(
            value
                .trim()
                .parse::<u32>()
                .map_err(|e| RequestError::Capacity {
                    n,
                    name: "cores",
                    value: value.to_string(),
                    reason: format!("not a whole number of percent ({e})"),
                })?,
        ),
    };
    Ok(Consumed { memory, cores })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slices(results: &[Value]) -> Result<Vec<SliceOfRequest>, RequestError> {
        let numbered: Vec<(usize, &Value)> = results.iter().enumerate().collect();
        SliceOfRequest::of(&numbered)
    }

    /// The one slice of `results`.
    fn slice(results: &[Value]) -> Result<SliceOfRequest, RequestError> {
        let mut s = slices(results)?;
        assert_eq!(s.len(), 1, "{s:?}");
        Ok(s.remove(0))
    }

    fn result(device: &str, memory: Option<&str>, cores: Option<&str>) -> Value {
        let mut capacity = serde_json::Map::new();
        if let Some(m) = memory {
            capacity.insert("memory".into(), json!(m));
        }
        if let Some(c) = cores {
            capacity.insert("cores".into(), json!(c));
        }
        let mut r = json!({"request": "gpu", "driver": "gpuslice.io", "device": device});
        if !capacity.is_empty() {
            r["consumedCapacity"] = Value::Object(capacity);
        }
        r
    }

    #[test]
    fn a_request_for_two_gpus_is_one_slice_on_both() {
        let s = slice(&[
            result("gpu-1", Some("4Gi"), Some("30")),
            result("gpu-0", Some("4096Mi"), Some("30")),
        ])
        .unwrap();
        assert_eq!(s.indexes, [1, 0]);
        assert_eq!(
            s.consumed,
            Consumed {
                memory: Some(4 << 30),
                cores: Some(30)
            }
        );
    }

    #[test]
    fn a_gpu_given_to_the_request_twice_gives_the_slice_the_sum_there() {
        let s = slice(&[
            result("gpu-0", Some("2Gi"), Some("10")),
            result("gpu-0", Some("2Gi"), Some("20")),
        ])
        .unwrap();
        assert_eq!(s.indexes, [0]);
        assert_eq!(
            s.consumed,
            Consumed {
                memory: Some(4 << 30),
                cores: Some(30)
            }
        );
    }

    #[test]
    fn whole_gpus_are_a_slice_without_a_size() {
        let s = slice(&[result("gpu-0", None, None), result("gpu-1", None, None)]).unwrap();
        assert_eq!(s.indexes, [0, 1]);
        assert_eq!(s.consumed, Consumed::default());
    }

    #[test]
    fn gpus_the_request_consumes_different_parts_of_are_a_slice_each() {
        let memory = |m: u64| Consumed {
            memory: Some(m << 30),
            cores: None,
        };
        // count: 3 of 2Gi on a node of two GPUs, one of them given twice; and a whole GPU
        // beside a part of another.
        let s = slices(&[
            result("gpu-0", Some("2Gi"), None),
            result("gpu-1", Some("2Gi"), None),
            result("gpu-0", Some("2Gi"), None),
            result("gpu-2", Some("4Gi"), None),
        ])
        .unwrap();
        let found: Vec<(Vec<u32>, Consumed, usize)> = s
            .into_iter()
            .map(|s| (s.indexes, s.consumed, s.first))
            .collect();
        assert_eq!(
            found,
            [(vec![0, 2], memory(4), 0), (vec![1], memory(2), 1)],
            "gpu-0 twice is 4Gi there, as gpu-2 is"
        );
        let s = slices(&[
            result("gpu-0", Some("2Gi"), None),
            result("gpu-1", None, None),
        ])
        .unwrap();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(
            (s[1].indexes.as_slice(), s[1].consumed, s[1].first),
            (&[1][..], Consumed::default(), 1)
        );
    }

    #[test]
    fn a_gpu_given_twice_with_one_of_them_whole_is_refused() {
        let e = slice(&[
            result("gpu-0", None, None),
            result("gpu-0", Some("1Gi"), None),
        ])
        .unwrap_err();
        assert_eq!(e, RequestError::WholeTwice { n: 1, index: 0 });
    }

    #[test]
    fn bad_devices_and_capacities_are_refused_naming_the_result_and_value() {
        let cases = [
            (
                result("nvidia0", Some("1Gi"), None),
                "result 0: device \"nvidia0\"",
            ),
            (
                result("gpu-0", Some("lots"), None),
                "result 0: consumedCapacity memory=\"lots\": not a number",
            ),
            (
                result("gpu-0", Some("25%"), None),
                "result 0: consumedCapacity memory=\"25%\": a consumed capacity is a size",
            ),
            (
                result("gpu-0", Some("1Gi"), Some("3.5")),
                "result 0: consumedCapacity cores=\"3.5\": not a whole number",
            ),
        ];
        for (r, want) in cases {
            let e = slice(&[r]).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e:?} does not start with {want:?}");
        }
    }
}
