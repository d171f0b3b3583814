//! Reads glibc's linker cache (`/etc/ld.so.cache`), the list the NVIDIA toolkit finds the
//! driver's libraries in: a header (`glibc-ld.so.cache1.1`), fixed-size entries, then the
//! strings the entries point at. The format is glibc's `struct cache_file_new`; a cache in
//! the old libc5 format carries the new one after its own entries.

use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const HEADER_LEN: usize = 48;
const ENTRY_LEN: usize = 24;

/// An ELF library for glibc (`FLAG_ELF_LIBC6`).
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_REQUIRED_MASK: i32 = 0xff00;
const FLAG_X8664_LIB64: i32 = 0x0300;
const FLAG_AARCH64_LIB64: i32 = 0x0a00;

/// The word size and machine of a cached library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// The machine this is built for, 64-bit.
    Native,
    /// 32-bit libraries of the same family (i386 beside x86-64).
    Compat32,
}

/// One entry: a name the linker finds (a soname or a link name) and the file it opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
    pub arch: Arch,
}

#[derive(Debug, thiserror::Error)]
pub enum LdCacheError {
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a glibc linker cache: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// The entries of the cache at `path`, in the cache's order (the linker's preference).
pub fn read(path: &Path) -> Result<Vec<Entry>, LdCacheError> {
    let bytes = std::fs::read(path).map_err(|source| LdCacheError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes).map_err(|reason| LdCacheError::Format {
        path: path.to_path_buf(),
        reason,
    })
}

/// The entries of a cache held in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let start = bytes
        .windows(MAGIC.len())
        .position(|w| w == MAGIC)
        .ok_or("no glibc-ld.so.cache1.1 header")?;
    // Strings are addressed from the new format's header.
    let cache = &bytes[start..];
    if cache.len() < HEADER_LEN {
        return Err("the header is cut short".into());
    }
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(cache.get(at..at + 4)?.try_into().ok()?))
    };
    let nlibs = u32_at(20).ok_or("the header is cut short")? as usize;
    let entries_end = nlibs
        .checked_mul(ENTRY_LEN)
        .and_then(|n| n.checked_add(HEADER_LEN))
        .filter(|&end| end <= cache.len())
        .ok_or_else(|| format!("{nlibs} entries do not fit in {} bytes", cache.len()))?;
    let string = |offset: u32| -> Result<&str, String> {
        let tail = cache
            .get(offset as usize..)
            .ok_or_else(|| format!("string offset {offset} is past the end"))?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| format!("string at {offset} is not terminated"))?;
        std::str::from_utf8(&tail[..end]).map_err(|_| format!("string at {offset} is not UTF-8"))
    };
    let native = if cfg!(target_arch = "aarch64") {
        FLAG_AARCH64_LIB64
    } else {
        FLAG_X8664_LIB64
    };
    let mut out = Vec::with_capacity(nlibs);
    for at in (HEADER_LEN..entries_end).step_by(ENTRY_LEN) {
        let flags = u32_at(at).ok_or("an entry is cut short")? as i32;
        if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6 {
            continue;
        }
        let arch = match flags & FLAG_REQUIRED_MASK {
            f if f == native => Arch::Native,
            0 => Arch::Compat32,
            _ => continue,
        };
        let key = u32_at(at + 4).ok_or("an entry is cut short")?;
        let value = u32_at(at + 8).ok_or("an entry is cut short")?;
        out.push(Entry {
            name: string(key)?.to_string(),
            path: PathBuf::from(string(value)?),
            arch,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_cache_reads_as_ldconfig_prints_it() {
        let Ok(printed) = std::process::Command::new("ldconfig").arg("-p").output() else {
            panic!("ldconfig is part of every glibc system");
        };
        let printed = String::from_utf8_lossy(&printed.stdout);
        let entries = read(Path::new("/etc/ld.so.cache")).unwrap();
        // `ldconfig -p`: "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6".
        let native: Vec<(String, String)> = printed
            .lines()
            .filter(|l| l.contains("x86-64") || l.contains("AArch64"))
            .filter_map(|l| {
                let (name, path) = l.trim().split_once(" => ")?;
                Some((name.split(" (").next()?.to_string(), path.to_string()))
            })
            .collect();
        let ours: Vec<(String, String)> = entries
            .iter()
            .filter(|e| e.arch == Arch::Native)
            .map(|e| (e.name.clone(), e.path.display().to_string()))
            .collect();
        assert!(!ours.is_empty());
        assert_eq!(ours, native);
    }

    #[test]
    fn a_cut_or_foreign_file_is_refused_with_the_reason() {
        assert!(parse(b"not a cache").unwrap_err().contains("header"));
        let mut cut = MAGIC.to_vec();
        cut.extend([0u8; 28]);
        cut[20..24].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&cut).unwrap_err().contains("1000 entries"));
    }
}
