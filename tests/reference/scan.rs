// Shared by the fake libraries' build scripts (`include!`d): which entry points a crate's
// sources define, as `extern "C" fn NAME`, as the first argument of an item macro written
// at the start of a line (`getter!(NAME, ...)`), or as a `NAME => target(...)` row of a
// macro table, with the file stem that defines each.

/// Entry point name → the stem of the source file that defines it.
fn modelled_functions(src: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        for part in text.split("extern \"C\" fn ").skip(1) {
            found.insert(ident(part), stem.clone());
        }
        for line in text.lines() {
            if let Some((name, _)) = line.trim_start().split_once(" => ")
                && name.starts_with("cu")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                found.insert(name.to_string(), stem.clone());
            }
            if let Some((mac, rest)) = line.split_once("!(")
                && !mac.is_empty()
                && mac.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && mac != "macro_rules"
            {
                let name = ident(rest);
                if !name.is_empty() {
                    found.insert(name, stem.clone());
                }
            }
        }
    }
    found
}
