//! The node's ResourceSlice: one device per GPU (`gpu-<index>`) with its attributes and its
//! consumable capacities (`memory`, `cores`), shared by several claims at once
//! (`allowMultipleAllocations`, KEP-5075), each request rounded to the policy's step.

use gpuslice_core::inventory::{Inventory, brand_display};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, PostParams};

/// The smallest memory a claim takes from a GPU, and the step requests are rounded up to.
pub const MEMORY_STEP_BYTES: u64 = 256 << 20;

/// The name of the node's ResourceSlice.
#[must_use]
pub fn slice_name(node: &str) -> String {
    format!("{node}-{}", crate::DRIVER)
}

/// A semantic version from a driver version: NVIDIA writes `535.104.05`, semver has no
/// leading zeros.
#[must_use]
pub fn semver(version: &str) -> String {
    let mut parts: Vec<String> = version
        .split('.')
        .map(|p| p.trim_start_matches('0'))
        .map(|p| {
            if p.is_empty() {
                "0".to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    parts.resize(3.max(parts.len()), "0".into());
    parts.join(".")
}

/// The ResourceSlice of `node` with the GPUs of `inventory`.
#[must_use]
pub fn resource_slice(node: &str, inventory: &Inventory, generation: i64) -> ResourceSlice {
    let string = |s: &str| DeviceAttribute {
        string: Some(s.to_string()),
        ..DeviceAttribute::default()
    };
    let version = |v: String| DeviceAttribute {
        version: Some(v),
        ..DeviceAttribute::default()
    };
    let int = |i: i64| DeviceAttribute {
        int: Some(i),
        ..DeviceAttribute::default()
    };
    let devices = inventory
        .gpus
        .iter()
        .map(|g| {
            let mut attributes = std::collections::BTreeMap::from([
                ("model".to_string(), string(&g.name)),
                ("uuid".to_string(), string(&g.uuid)),
                ("index".to_string(), int(i64::from(g.index))),
                (
                    "driverVersion".to_string(),
                    version(semver(&inventory.driver_version)),
                ),
            ]);
            if let Some(c) = inventory.cuda_driver_version {
                let cuda = format!("{}.{}", c / 1000, (c % 1000) / 10);
                attributes.insert("cudaDriverVersion".into(), version(semver(&cuda)));
            }
            if let Some(cc) = &g.compute_capability {
                attributes.insert("computeCapability".into(), version(semver(cc)));
            }
            // As NVIDIA's DRA driver writes it (`Nvidia`, `Tesla`, ...).
            if let Some(brand) = g.brand.as_deref().and_then(brand_display) {
                attributes.insert("brand".into(), string(brand));
            }
            if let Some(n) = g.numa_node {
                attributes.insert("numaNode".into(), int(i64::from(n)));
            }
            let usable = g.memory_usable_bytes();
            let memory = DeviceCapacity {
                value: Quantity(usable.to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(Quantity(usable.to_string())),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: Quantity(MEMORY_STEP_BYTES.to_string()),
                        max: Some(Quantity(usable.to_string())),
                        step: Some(Quantity(MEMORY_STEP_BYTES.to_string())),
                    }),
                    valid_values: None,
                }),
            };
            let cores = DeviceCapacity {
                value: Quantity("100".into()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(Quantity("0".into())),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: Quantity("0".into()),
                        max: Some(Quantity("100".into())),
                        step: Some(Quantity("1".into())),
                    }),
                    valid_values: None,
                }),
            };
            Device {
                name: format!("gpu-{}", g.index),
                attributes: Some(attributes),
                capacity: Some(std::collections::BTreeMap::from([
                    ("memory".to_string(), memory),
                    ("cores".to_string(), cores),
                ])),
                allow_multiple_allocations: Some(true),
                ..Device::default()
            }
        })
        .collect();
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: crate::DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

/// Creates the node's ResourceSlice, or replaces it when it changed (a new pool generation).
pub async fn publish(
    client: &kube::Client,
    node: &str,
    inventory: &Inventory,
) -> Result<(), kube::Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice_name(node);
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &resource_slice(node, inventory, 1))
                .await?;
        }
        Some(current) => {
            let generation = current.spec.pool.generation;
            let mut wanted = resource_slice(node, inventory, generation);
            if wanted.spec != current.spec {
                wanted.spec.pool.generation = generation + 1;
                wanted.metadata.resource_version = current.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &wanted).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_versions_become_semantic_versions() {
        assert_eq!(semver("535.104.05"), "535.104.5");
        assert_eq!(semver("550.54.15"), "550.54.15");
        assert_eq!(semver("12.4"), "12.4.0");
    }

    #[test]
    fn a_gpus_memory_capacity_leaves_out_what_its_driver_reserves() {
        let gpu = gpuslice_core::inventory::GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_bytes: 81_559 << 20,
            memory_reserved_bytes: 384 << 20,
            minor: 0,
            pci_bus_id: "00000000:17:00.0".into(),
            numa_node: None,
            compute_capability: None,
            brand: None,
        };
        let inventory = Inventory {
            driver_version: "580.159.04".into(),
            cuda_driver_version: None,
            gpus: vec![gpu],
            topology: None,
        };
        let slice = resource_slice("n", &inventory, 1);
        let devices = slice.spec.devices.unwrap();
        let memory = &devices[0].capacity.as_ref().unwrap()["memory"];
        let usable = (81_559u64 - 384) << 20;
        assert_eq!(memory.value.0, usable.to_string());
        let policy = memory.request_policy.as_ref().unwrap();
        assert_eq!(policy.default.as_ref().unwrap().0, usable.to_string());
        let range = policy.valid_range.as_ref().unwrap();
        assert_eq!(range.max.as_ref().unwrap().0, usable.to_string());
    }
}
