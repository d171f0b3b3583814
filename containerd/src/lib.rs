//! Adding the `gpuslice` runtime handler to a containerd configuration, in place or as a
//! drop-in, for configuration versions 1, 2 (containerd 1.x) and 3 (containerd 2.x), keeping
//! everything else in the file (other tables, comments, formatting) as it was.
//!
//! The handler runs pods with `runtime_type = "io.containerd.runc.v2"` and
//! `options.BinaryName` pointing at `gpuslice-runtime`, and lets `gpuslice.io/*` pod
//! annotations through to the containers' OCI specs (`pod_annotations`). Everything else it
//! takes from the default runtime when that one is runc's (`SystemdCgroup` above all), so that
//! its containers are run as the node's other containers are.

use toml_edit::{Array, DocumentMut, Item, Table, value};

/// Annotation patterns containerd passes from pods to containers for the handler.
pub const POD_ANNOTATIONS: &str = "gpuslice.io/*";
/// The runtime type of the handler: containerd's runc shim, which runs `BinaryName`.
pub const RUNTIME_TYPE: &str = "io.containerd.runc.v2";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("containerd configuration is not valid TOML: {0}")]
    Parse(#[from] toml_edit::TomlError),
    #[error("containerd configuration version {0} is not supported (versions 1, 2 and 3 are)")]
    Version(i64),
    #[error("containerd configuration: `{0}` is not a table")]
    NotTable(String),
    #[error("containerd configuration: `imports` is not an array of strings")]
    Imports,
}

/// What to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handler {
    /// The runtime handler name (the RuntimeClass's `handler`).
    pub name: String,
    /// Path of `gpuslice-runtime`.
    pub binary: String,
}

/// The configuration version of `doc` (1 when the file does not say, as containerd reads it).
pub fn version(doc: &DocumentMut) -> Result<i64, ConfigError> {
    let v = doc.get("version").and_then(Item::as_integer).unwrap_or(1);
    if (1..=3).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::Version(v))
    }
}

/// The name of the CRI plugin (the one holding the runtimes) in a configuration version.
fn cri_plugin(version: i64) -> &'static str {
    match version {
        1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        _ => "io.containerd.cri.v1.runtime",
    }
}

/// The key path of the CRI plugin's runtimes table for a configuration version.
fn runtimes_path(version: i64) -> [&'static str; 4] {
    ["plugins", cri_plugin(version), "containerd", "runtimes"]
}

/// The runtime containerd uses when a pod names no handler.
const DEFAULT_RUNTIME: &str = "runc";

fn child<'a>(table: &'a mut Table, key: &str, path: &str) -> Result<&'a mut Table, ConfigError> {
    let item = table.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    item.as_table_mut()
        .ok_or_else(|| ConfigError::NotTable(path.to_string()))
}

/// Adds (or updates) the handler in `doc`, a configuration of its own version.
pub fn add_handler(doc: &mut DocumentMut, handler: &Handler) -> Result<(), ConfigError> {
    let version = version(doc)?;
    let mut table = doc.as_table_mut();
    let mut path = String::new();
    let mut default_runtime = DEFAULT_RUNTIME.to_string();
    for key in runtimes_path(version) {
        path = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        if key == "runtimes"
            && let Some(name) = table.get("default_runtime_name").and_then(Item::as_str)
        {
            default_runtime = name.to_string();
        }
        table = child(table, key, &path)?;
    }
    // A `runtimes` table written in the file replaces containerd's built-in one, which holds
    // `runc`: without it the CRI plugin refuses to load ("no corresponding runtime configured
    // ... default_runtime_name"). Write the built-in definition when the file has none.
    if default_runtime == DEFAULT_RUNTIME && !table.contains_key(DEFAULT_RUNTIME) {
        let mut runc = Table::new();
        runc.insert("runtime_type", value(RUNTIME_TYPE));
        table.insert(DEFAULT_RUNTIME, Item::Table(runc));
    }
    let base = (default_runtime != handler.name)
        .then(|| table.get(&default_runtime).and_then(Item::as_table))
        .flatten()
        .filter(|t| is_runc(t))
        .cloned();
    let runtime = child(table, &handler.name, &format!("{path}.{}", handler.name))?;
    runtime.set_implicit(false);
    if let Some(base) = &base {
        inherit(runtime, base);
    }
    runtime.insert("runtime_type", value(RUNTIME_TYPE));
    let mut annotations = Array::new();
    for a in base
        .as_ref()
        .and_then(|b| b.get("pod_annotations"))
        .and_then(Item::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .filter(|&a| a != POD_ANNOTATIONS)
    {
        annotations.push(a);
    }
    annotations.push(POD_ANNOTATIONS);
    runtime.insert("pod_annotations", value(annotations));
    let options = child(
        runtime,
        "options",
        &format!("{path}.{}.options", handler.name),
    )?;
    options.set_implicit(false);
    if let Some(base_options) = base
        .as_ref()
        .and_then(|b| b.get("options"))
        .and_then(Item::as_table)
    {
        for (key, item) in base_options {
            if key != "BinaryName" {
                options.insert(key, item.clone());
            }
        }
    }
    options.insert("BinaryName", value(handler.binary.as_str()));
    Ok(())
}

/// Removes the handler `name` from `doc`, a configuration of its own version; everything else
/// stays as it is. Returns whether the handler was there.
pub fn remove_handler(doc: &mut DocumentMut, name: &str) -> Result<bool, ConfigError> {
    let version = version(doc)?;
    let mut table = doc.as_table_mut();
    let mut path = String::new();
    for key in runtimes_path(version) {
        path = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        match table.get_mut(key) {
            None => return Ok(false),
            Some(item) => {
                table = item
                    .as_table_mut()
                    .ok_or_else(|| ConfigError::NotTable(path.clone()))?;
            }
        }
    }
    Ok(table.remove(name).is_some())
}

/// Whether a runtime's table runs containers with runc's shim (containerd's default type when
/// the table names none), whose options the handler can take over.
fn is_runc(runtime: &Table) -> bool {
    runtime
        .get("runtime_type")
        .and_then(Item::as_str)
        .is_none_or(|t| t == RUNTIME_TYPE)
}

/// Makes the handler behave as the default runtime does: every setting of `base` (cgroup
/// driver, runc root, sandbox and snapshotter settings, base OCI spec…) except those the
/// handler sets itself (`runtime_type`, `pod_annotations`, `options.BinaryName`), which
/// [`add_handler`] writes after. Above all `options.SystemdCgroup`: a handler without it on a
/// node whose kubelet uses the systemd cgroup driver puts containers in cgroupfs paths that
/// the kubelet does not manage.
fn inherit(runtime: &mut Table, base: &Table) {
    for (key, item) in base {
        if !matches!(key, "runtime_type" | "pod_annotations" | "options") {
            runtime.insert(key, item.clone());
        }
    }
}

/// A drop-in file for the main configuration `main`: its CRI plugin table with the handler
/// added. containerd 1.x replaces a plugin's whole table with an imported one (checked with
/// `containerd config dump`: a drop-in holding only the handler loses `sandbox_image` and the
/// `runc` options of the main file), so the drop-in carries a copy of the main file's table;
/// run `configure` again after changing that table in the main file.
pub fn drop_in(main: &DocumentMut, handler: &Handler) -> Result<String, ConfigError> {
    let version = version(main)?;
    let mut doc: DocumentMut = format!(
        "# Written by gpuslice-containerd: the gpuslice runtime handler, with a copy of the\n\
         # main configuration's CRI plugin table (imports replace whole plugin tables).\nversion = {version}\n"
    )
    .parse()?;
    let plugin = cri_plugin(version);
    let main_table = main
        .get("plugins")
        .and_then(Item::as_table)
        .and_then(|p| p.get(plugin))
        .and_then(Item::as_table);
    if let Some(table) = main_table {
        let plugins = child(doc.as_table_mut(), "plugins", "plugins")?;
        plugins.insert(plugin, Item::Table(table.clone()));
    }
    add_handler(&mut doc, handler)?;
    Ok(doc.to_string())
}

/// Makes `doc` import `path` (unless an entry already names it).
pub fn add_import(doc: &mut DocumentMut, path: &str) -> Result<(), ConfigError> {
    if doc.get("version").is_none() {
        // Imports need version 2 or later; containerd 1.x reads an unversioned file as 1.
        return Err(ConfigError::Version(1));
    }
    let imports = doc.entry("imports").or_insert_with(|| value(Array::new()));
    let array = imports.as_array_mut().ok_or(ConfigError::Imports)?;
    if array.iter().any(|v| v.as_str() == Some(path)) {
        return Ok(());
    }
    array.push(path);
    Ok(())
}

#[cfg(test)]
mod tests;
