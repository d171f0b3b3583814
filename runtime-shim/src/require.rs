//! The NVIDIA toolkit's `NVIDIA_REQUIRE_*` constraints, which CUDA images set
//! (`NVIDIA_REQUIRE_CUDA=cuda>=12.2 brand=tesla,driver>=470,driver<471 …`): within one
//! variable, space-separated alternatives of which one must hold, each a comma-separated list
//! of constraints that must all hold; every such variable must hold.
//! `NVIDIA_DISABLE_REQUIRE` (any value but `false`/`0`/empty) turns the check off.
//!
//! `cuda` (the driver's CUDA version, major.minor), `driver` (its version), `arch` (the
//! compute capability of every GPU the container gets) and `brand` (the product brand NVML
//! reports for every GPU it gets, named as the toolkit names it: `nvidia`, `tesla`, ...; `=`
//! and `!=` only, case aside) are checked. So the forward-compatibility alternatives of CUDA
//! images (`brand=nvidia,driver>=535,driver<536`: an image newer than the driver's CUDA, run
//! with its own compatibility libraries on that driver branch) are taken as the toolkit
//! takes them.

use crate::nvidia_env::lookup;

/// What the node offers: the driver's version and the CUDA version it supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    pub version: String,
    /// The CUDA driver API version as the driver reports it (12040 for 12.4).
    pub cuda: Option<i32>,
    /// The compute capabilities (`7.5`) of the GPUs the container gets; `None` before they
    /// are known, when `arch` constraints are left to the check after the claim.
    pub arch: Option<Vec<String>>,
    /// The brands (`nvidia`) of the GPUs the container gets, as `arch`.
    pub brand: Option<Vec<String>>,
}

/// A requirement that does not hold: the variable, its value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {reason} (set NVIDIA_DISABLE_REQUIRE=true to start it anyway)")]
pub struct Unmet {
    pub variable: String,
    pub value: String,
    pub reason: String,
}

/// Whether `env` asks for any requirement to be checked.
#[must_use]
pub fn any(env: &[String]) -> bool {
    !disabled(env) && env.iter().any(|e| e.starts_with("NVIDIA_REQUIRE_"))
}

fn disabled(env: &[String]) -> bool {
    lookup(env, "NVIDIA_DISABLE_REQUIRE")
        .map(str::trim)
        .is_some_and(|v| !matches!(v, "" | "false" | "0"))
}

/// Checks every `NVIDIA_REQUIRE_*` of `env` against `driver`.
pub fn check(env: &[String], driver: &Driver) -> Result<(), Unmet> {
    if disabled(env) {
        return Ok(());
    }
    let mut names: Vec<&str> = env
        .iter()
        .filter_map(|e| e.split_once('=').map(|(k, _)| k))
        .filter(|k| k.starts_with("NVIDIA_REQUIRE_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let value = lookup(env, name).unwrap_or_default();
        let alternatives: Vec<&str> = value.split_whitespace().collect();
        if alternatives.is_empty() {
            continue;
        }
        let mut reasons = Vec::new();
        let held = alternatives.iter().any(|alt| {
            alt.split(',')
                .filter(|c| !c.is_empty())
                .try_for_each(|c| constraint(c, driver))
                .map_err(|r| reasons.push(r))
                .is_ok()
        });
        if !held {
            return Err(Unmet {
                variable: name.to_string(),
                value: value.to_string(),
                reason: reasons.join("; "),
            });
        }
    }
    Ok(())
}

/// One constraint (`cuda>=12.2`), `Err` with why it does not hold.
fn constraint(c: &str, driver: &Driver) -> Result<(), String> {
    const OPS: [&str; 7] = [">=", "<=", "!=", "==", ">", "<", "="];
    let Some((key, op, want)) = OPS
        .iter()
        .find_map(|op| c.split_once(op).map(|(k, v)| (k.trim(), *op, v.trim())))
    else {
        return Err(format!("{c:?} is not KEY OP VALUE"));
    };
    // What the node has, and whose it is, for the message.
    let (have, whose): (Vec<String>, &str) = match key {
        "cuda" => (
            vec![
                driver
                    .cuda
                    .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
                    .ok_or("the driver's CUDA version is unknown")?,
            ],
            "the driver's cuda",
        ),
        "driver" => (vec![driver.version.clone()], "the driver's driver"),
        "arch" => match &driver.arch {
            // Not known before the claim: left to the check after it.
            None => return Ok(()),
            Some(a) if a.is_empty() => {
                return Err(format!("{c}: the GPU's arch is not known here"));
            }
            Some(a) => (a.clone(), "a GPU's arch"),
        },
        "brand" => return brand(c, op, want, driver.brand.as_deref()),
        other => return Err(format!("{c}: unknown constraint {other:?}")),
    };
    for h in &have {
        let ord = compare(h, want).ok_or_else(|| format!("{c}: {want:?} is not a version"))?;
        let holds = match op {
            ">=" => ord.is_ge(),
            "<=" => ord.is_le(),
            ">" => ord.is_gt(),
            "<" => ord.is_lt(),
            "!=" => ord.is_ne(),
            _ => ord.is_eq(),
        };
        if !holds {
            return Err(format!("{c} does not hold: {whose} is {h}"));
        }
    }
    Ok(())
}

/// A `brand` constraint against the brands of the GPUs given (`None` before they are known:
/// left to the check after the claim).
fn brand(c: &str, op: &str, want: &str, have: Option<&[String]>) -> Result<(), String> {
    let Some(have) = have else {
        return Ok(());
    };
    if have.is_empty() {
        return Err(format!("{c}: the GPU's brand is not known here"));
    }
    let equal = match op {
        "=" | "==" => true,
        "!=" => false,
        _ => return Err(format!("{c}: a brand is compared with = or != only")),
    };
    match have.iter().find(|h| h.eq_ignore_ascii_case(want) != equal) {
        Some(h) => Err(format!("{c} does not hold: a GPU's brand is {h}")),
        None => Ok(()),
    }
}

/// Whether any `NVIDIA_REQUIRE_*` of `env` constrains what a GPU is (`arch`, `brand`): checked
/// once the GPUs are known.
#[must_use]
pub fn names_gpu(env: &[String]) -> bool {
    env.iter()
        .filter(|e| e.starts_with("NVIDIA_REQUIRE_"))
        .any(|e| {
            e.split_once('=')
                .is_some_and(|(_, v)| v.contains("arch") || v.contains("brand"))
        })
}

/// Compares dotted versions numerically, a missing part counting as 0.
fn compare(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let parts = |s: &str| -> Option<Vec<u64>> { s.split('.').map(|p| p.parse().ok()).collect() };
    let (mut a, mut b) = (parts(a)?, parts(b)?);
    let n = a.len().max(b.len());
    a.resize(n, 0);
    b.resize(n, 0);
    Some(a.cmp(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(e: &[&str]) -> Vec<String> {
        e.iter().map(|s| (*s).to_string()).collect()
    }

    const DRIVER: Driver = Driver {
        version: String::new(),
        cuda: Some(12_020),
        arch: None,
        brand: None,
    };

    fn driver() -> Driver {
        Driver {
            version: "535.104.05".into(),
            ..DRIVER
        }
    }

    #[test]
    fn a_cuda_image_runs_where_the_driver_is_new_enough() {
        let image = "NVIDIA_REQUIRE_CUDA=cuda>=12.2 brand=tesla,driver>=470,driver<471";
        assert_eq!(check(&env(&[image]), &driver()), Ok(()));
    }

    #[test]
    fn a_newer_cuda_image_is_refused_with_the_version_the_driver_has() {
        let image = "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471";
        let e = check(&env(&[image]), &driver()).unwrap_err();
        assert_eq!(e.variable, "NVIDIA_REQUIRE_CUDA");
        assert!(
            e.to_string()
                .contains("cuda>=12.4 does not hold: the driver's cuda is 12.2"),
            "{e}"
        );
        // Turned off as with the toolkit.
        assert_eq!(
            check(&env(&[image, "NVIDIA_DISABLE_REQUIRE=true"]), &driver()),
            Ok(())
        );
        assert!(!any(&env(&[image, "NVIDIA_DISABLE_REQUIRE=1"])));
        assert!(check(&env(&[image, "NVIDIA_DISABLE_REQUIRE=false"]), &driver()).is_err());
    }

    #[test]
    fn every_variable_must_hold_and_commas_join_constraints() {
        let e = env(&[
            "NVIDIA_REQUIRE_CUDA=cuda>=11.0",
            "NVIDIA_REQUIRE_DRIVER=driver>=535,driver<535.100",
        ]);
        assert!(
            check(&e, &driver()).is_err(),
            "535.104.05 is not below 535.100"
        );
        let e = env(&[
            "NVIDIA_REQUIRE_CUDA=cuda>=11.0",
            "NVIDIA_REQUIRE_DRIVER=driver>=535,driver<536",
        ]);
        assert_eq!(check(&e, &driver()), Ok(()));
    }

    #[test]
    fn arch_holds_when_every_gpu_given_has_it_and_waits_until_they_are_known() {
        let e = env(&["NVIDIA_REQUIRE_ARCH=arch>=8.0"]);
        assert!(names_gpu(&e));
        assert_eq!(
            check(&e, &driver()),
            Ok(()),
            "not known yet: left to the check after the claim"
        );
        let with = |archs: &[&str]| Driver {
            arch: Some(archs.iter().map(|a| (*a).to_string()).collect()),
            ..driver()
        };
        assert_eq!(check(&e, &with(&["8.6", "9.0"])), Ok(()));
        let refused = check(&e, &with(&["8.6", "7.5"])).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("arch>=8.0 does not hold: a GPU's arch is 7.5"),
            "{refused}"
        );
        assert!(
            check(&e, &with(&[])).is_err(),
            "no GPU known: it does not hold"
        );
        assert!(!names_gpu(&env(&["NVIDIA_REQUIRE_CUDA=cuda>=12.0"])));
    }

    #[test]
    fn an_image_newer_than_the_drivers_cuda_runs_by_its_brand_alternative_once_the_gpus_are_known()
    {
        // As nvidia/cuda:12.4 images set it, on a 535 driver (CUDA 12.2) of data-center GPUs.
        let image = "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471 \
                     brand=nvidia,driver>=535,driver<536 brand=geforce,driver>=535,driver<536";
        let e = env(&[image]);
        assert!(names_gpu(&e));
        assert_eq!(check(&e, &driver()), Ok(()), "the brands are not known yet");
        let with = |brands: &[&str]| Driver {
            brand: Some(brands.iter().map(|b| (*b).to_string()).collect()),
            ..driver()
        };
        assert_eq!(check(&e, &with(&["nvidia", "nvidia"])), Ok(()));
        let refused = check(&e, &with(&["nvidia", "quadro"])).unwrap_err();
        assert!(
            refused
                .reason
                .contains("brand=nvidia does not hold: a GPU's brand is quadro"),
            "{refused}"
        );
        assert!(
            check(&e, &with(&[])).is_err(),
            "no GPU known: it does not hold"
        );
        // Another driver branch: only the CUDA version could hold.
        let newer = Driver {
            version: "550.54.15".into(),
            ..with(&["nvidia"])
        };
        let refused = check(&e, &newer).unwrap_err();
        assert!(
            refused.reason.contains("the driver's cuda is 12.2"),
            "{refused}"
        );
    }

    #[test]
    fn a_brand_is_compared_for_equality_only_and_case_aside() {
        let with = Driver {
            brand: Some(vec!["nvidia".into()]),
            ..driver()
        };
        assert_eq!(
            check(&env(&["NVIDIA_REQUIRE_BRAND=brand==Nvidia"]), &with),
            Ok(())
        );
        assert_eq!(
            check(&env(&["NVIDIA_REQUIRE_BRAND=brand!=geforce"]), &with),
            Ok(())
        );
        assert!(check(&env(&["NVIDIA_REQUIRE_BRAND=brand!=nvidia"]), &with).is_err());
        let ordered = check(&env(&["NVIDIA_REQUIRE_BRAND=brand>=nvidia"]), &with).unwrap_err();
        assert!(
            ordered.reason.contains("compared with = or != only"),
            "{ordered}"
        );
    }

    #[test]
    fn versions_compare_by_number_not_by_text() {
        assert_eq!(compare("12.10", "12.9"), Some(std::cmp::Ordering::Greater));
        assert_eq!(
            compare("535.104.05", "535.104.5"),
            Some(std::cmp::Ordering::Equal)
        );
        assert_eq!(compare("12", "12.0"), Some(std::cmp::Ordering::Equal));
        assert_eq!(compare("12.x", "12"), None);
    }
}
