//! What a module image declares: its length, the sizes of the global variables its cubins
//! define, which the driver allocates in device memory when it loads the module, and the
//! local memory each thread of each of its kernels needs (and, where asked, their parameter
//! layouts: [`crate::params`]). The simulated driver allocates the
//! globals (and `cuModuleGetGlobal` answers) and reports the kernels' local memory from this,
//! and the interception library charges the globals before the driver is asked to load the
//! module. An image is a fat binary (magic `0xBA55ED50`, holding PTX and ELF cubins), an ELF
//! cubin (as long as the furthest of its header tables, sections and segments), or
//! NUL-terminated PTX text. Fat binary entries compressed by `nvcc` (LZ4 or Zstandard,
//! [`crate::compressed`]) are read for the device the module is loaded on, those the driver
//! would pick for its architecture. The fat binary's layout is undocumented; as public
//! reimplementations of the driver describe it: a 16-byte header (magic, version, header
//! size, size of the entries), then entries of a header (kind 1 PTX, 2 ELF; its own size; the
//! payload's size; the architecture at byte 28; flags at byte 40) followed by the payload.

// Reading an image a C caller passed by pointer is an FFI edge.
#![allow(unsafe_code)]

use std::collections::HashMap;

use crate::compressed;
use crate::params::{self, Param};

pub(crate) const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The wrapper the CUDA runtime registers a fat binary by (`__fatBinC_Wrapper_t`).
const FATBIN_WRAPPER_MAGIC: u32 = 0x466_243B1;
pub(crate) const ENTRY_PTX: u16 = 1;
pub(crate) const ENTRY_ELF: u16 = 2;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The bytes of the image at `image`, as far as its own headers say it extends (for the
/// runtime's wrapper of a fat binary, the fat binary's).
///
/// # Safety
/// `image` points at a module image as `cuModuleLoadData` takes one.
pub unsafe fn bytes<'a>(image: *const u8) -> &'a [u8] {
    // SAFETY: every image kind starts with at least 16 readable bytes, or is PTX text whose
    // NUL ends it; the first 4 bytes tell the kind.
    let head = unsafe { std::slice::from_raw_parts(image, 4) };
    if u32_at(head, 0) == Some(FATBIN_WRAPPER_MAGIC) {
        // SAFETY: the wrapper (`__fatBinC_Wrapper_t`: magic, version, the fat binary's
        // address, a file name) is 24 bytes.
        let w = unsafe { std::slice::from_raw_parts(image, 24) };
        let inner = u64_at(w, 8).unwrap_or(0) as usize as *const u8;
        if inner.is_null() {
            return &[];
        }
        // SAFETY: the wrapper's fat binary.
        return unsafe { bytes(inner) };
    }
    let len = if u32_at(head, 0) == Some(FATBIN_MAGIC) {
        // SAFETY: a fat binary header is 16 bytes.
        let h = unsafe { std::slice::from_raw_parts(image, 16) };
        usize::from(u16_at(h, 6).unwrap_or(16)) + u64_at(h, 8).unwrap_or(0) as usize
    } else if head == ELF_MAGIC {
        // SAFETY: an ELF64 header is 64 bytes.
        let h = unsafe { std::slice::from_raw_parts(image, 64) };
        let tables = elf_header_tables_end(h);
        // SAFETY: the header's tables (section and program headers) lie within the file.
        elf_extent(unsafe { std::slice::from_raw_parts(image, tables) })
    } else {
        // SAFETY: PTX text is NUL-terminated.
        unsafe { std::ffi::CStr::from_ptr(image.cast()) }
            .to_bytes()
            .len()
    };
    // SAFETY: the image's own headers give its extent.
    unsafe { std::slice::from_raw_parts(image, len) }
}

/// One entry of a fat binary, as its header describes it.
struct Entry<'a> {
    kind: u16,
    /// The architecture it is for, as 10 × major + minor (86: compute capability 8.6).
    arch: u32,
    flags: u64,
    /// Its payload, compressed or not.
    payload: &'a [u8],
    /// Its size uncompressed, for a compressed one.
    size: u64,
}

impl Entry<'_> {
    fn compressed(&self) -> bool {
        self.flags & (compressed::LZ4 | compressed::ZSTD) != 0
    }
}

/// The entries of the fat binary `image`, in its order.
fn entries(image: &[u8]) -> Vec<Entry<'_>> {
    let mut out = Vec::new();
    let mut at = usize::from(u16_at(image, 6).unwrap_or(16));
    while let (Some(kind), Some(header), Some(padded)) = (
        u16_at(image, at),
        u32_at(image, at + 4),
        u64_at(image, at + 8),
    ) {
        let payload = at + header as usize;
        let end = payload.saturating_add(padded as usize);
        let flags = u64_at(image, at + 40).unwrap_or(0);
        let entry = Entry {
            kind,
            arch: u32_at(image, at + 28).unwrap_or(0),
            flags,
            payload: image.get(payload..end).unwrap_or_default(),
            size: u64_at(image, at + 56).unwrap_or(0),
        };
        if entry.compressed() {
            // The compressed data alone, without the padding after it.
            let len = u32_at(image, at + 16).unwrap_or(0) as usize;
            out.push(Entry {
                payload: entry.payload.get(..len).unwrap_or_default(),
                ..entry
            });
        } else {
            out.push(entry);
        }
        if header == 0 || end <= at {
            break;
        }
        at = end;
    }
    out
}

/// The compressed entries the driver would load for a device of architecture `arch`: the ELF
/// cubins of the newest architecture of the device's major version not newer than the device
/// (a cubin runs on later minor versions of its major one), or where there is none, the PTX of
/// the newest architecture not newer than the device (which the driver compiles).
fn compressed_for<'a, 'e>(entries: &'e [Entry<'a>], arch: u32) -> Vec<&'e Entry<'a>> {
    let runs = |e: &Entry<'_>| e.kind == ENTRY_ELF && e.arch / 10 == arch / 10 && e.arch <= arch;
    let compiles = |e: &Entry<'_>| e.kind == ENTRY_PTX && e.arch <= arch;
    let pick = |fits: &dyn Fn(&Entry<'_>) -> bool| {
        let best = entries.iter().filter(|e| fits(e)).map(|e| e.arch).max()?;
        Some(
            entries
                .iter()
                .filter(|e| fits(e) && e.arch == best && e.compressed())
                .collect(),
        )
    };
    pick(&runs).or_else(|| pick(&compiles)).unwrap_or_default()
}

/// Calls `ptx` with the text of each PTX image or uncompressed fat binary PTX entry, and
/// `elf` with each ELF cubin, in the image's order; then, where the fat binary has compressed
/// entries, with those the driver would load on a device of architecture `arch()` (10 ×
/// major + minor), decompressed. `arch` is asked only then; where it answers None,
/// compressed entries are not read (decompressing every architecture's would take far
/// longer than the load: cuBLAS's fat binaries hold 2.7 GB).
fn for_each_entry(
    image: &[u8],
    arch: impl FnOnce() -> Option<u32>,
    mut ptx: impl FnMut(&str),
    mut elf: impl FnMut(&[u8]),
) {
    if !image.starts_with(ELF_MAGIC)
        && u32_at(image, 0) != Some(FATBIN_MAGIC)
        && let Ok(text) = std::str::from_utf8(image)
    {
        ptx(text);
    } else if image.starts_with(ELF_MAGIC) {
        elf(image);
    } else if u32_at(image, 0) == Some(FATBIN_MAGIC) {
        let entries = entries(image);
        let mut read = |kind: u16, payload: &[u8]| {
            if kind == ENTRY_ELF {
                elf(payload);
            } else if kind == ENTRY_PTX
                && let Ok(text) = std::str::from_utf8(payload)
            {
                ptx(text.trim_end_matches('\0'));
            }
        };
        for e in entries.iter().filter(|e| !e.compressed()) {
            read(e.kind, e.payload);
        }
        let arch = entries.iter().any(Entry::compressed).then(arch).flatten();
        for e in arch
            .map(|a| compressed_for(&entries, a))
            .unwrap_or_default()
        {
            if let Some(payload) = compressed::decompress(e.flags, e.payload, e.size) {
                read(e.kind, &payload);
            }
        }
    }
}

/// Where an ELF64 file's section and program header tables end, by its header `h`. nvcc
/// puts the section headers last; nvJitLink (CUDA 12) puts the program headers after them.
fn elf_header_tables_end(h: &[u8]) -> usize {
    let table = |off: usize, entsize: usize, num: usize| {
        let off = u64_at(h, off).unwrap_or(0) as usize;
        let size = usize::from(u16_at(h, entsize).unwrap_or(0))
            .saturating_mul(usize::from(u16_at(h, num).unwrap_or(0)));
        off.saturating_add(size)
    };
    table(0x28, 0x3a, 0x3c).max(table(0x20, 0x36, 0x38)).max(64)
}

/// The length of the ELF64 file whose header and header tables are `elf`: the furthest end of
/// those tables, of every section's data and of every segment's file image.
fn elf_extent(elf: &[u8]) -> usize {
    const SHT_NOBITS: u32 = 8;
    let mut end = elf.len();
    let shoff = u64_at(elf, 0x28).unwrap_or(0) as usize;
    let shentsize = usize::from(u16_at(elf, 0x3a).unwrap_or(0));
    for i in 0..usize::from(u16_at(elf, 0x3c).unwrap_or(0)) {
        let at = shoff.saturating_add(i.saturating_mul(shentsize));
        if u32_at(elf, at + 4).is_some_and(|t| t != SHT_NOBITS)
            && let (Some(off), Some(size)) = (u64_at(elf, at + 0x18), u64_at(elf, at + 0x20))
        {
            end = end.max(off.saturating_add(size) as usize);
        }
    }
    let phoff = u64_at(elf, 0x20).unwrap_or(0) as usize;
    let phentsize = usize::from(u16_at(elf, 0x36).unwrap_or(0));
    for i in 0..usize::from(u16_at(elf, 0x38).unwrap_or(0)) {
        let at = phoff.saturating_add(i.saturating_mul(phentsize));
        if let (Some(off), Some(size)) = (u64_at(elf, at + 8), u64_at(elf, at + 0x20)) {
            end = end.max(off.saturating_add(size) as usize);
        }
    }
    end
}

/// Global variables (name → bytes) that the image defines: in its ELF cubins, or declared in
/// its PTX text (`.global` declarations), a fat binary's PTX entries included (the same
/// variable in several entries counts once); a fat binary's compressed entries are read for a
/// device of architecture `arch()` ([`for_each_entry`]).
#[must_use]
pub fn globals(image: &[u8], arch: impl FnOnce() -> Option<u32>) -> HashMap<String, u64> {
    let found = std::cell::RefCell::new(HashMap::new());
    for_each_entry(
        image,
        arch,
        |text| ptx_globals(text, &mut found.borrow_mut()),
        |elf| elf_globals(elf, &mut found.borrow_mut()),
    );
    found.into_inner()
}

/// What a driver loading an image sets up for it: its global variables ([`globals`]) and the
/// local memory each thread of each of its kernels needs (name → bytes).
#[derive(Debug, Default)]
pub struct Contents {
    pub globals: HashMap<String, u64>,
    /// In an ELF cubin, the stack the compiler sized for the function (`.nv.info`'s minimum
    /// stack size, or its frame size where larger); in PTX, the `.local` arrays an `.entry`
    /// declares. A kernel in several entries (one per architecture) gets its largest figure.
    /// The driver backs this for every thread that can be resident on the device, growing
    /// the context's per-thread stack at a launch that needs more.
    pub kernel_locals: HashMap<String, u64>,
    /// Each kernel's parameter layout ([`params`]), where asked for ([`contents_with_params`]):
    /// the first entry that describes the kernel gives it (every architecture's is the same).
    pub kernel_params: HashMap<String, Vec<Param>>,
}

/// The image's [`Contents`] but its kernels' parameters, its entries read (and compressed ones
/// decompressed) once.
#[must_use]
pub fn contents(image: &[u8], arch: impl FnOnce() -> Option<u32>) -> Contents {
    read_contents(image, arch, false)
}

/// The image's [`Contents`], its kernels' parameter layouts included.
#[must_use]
pub fn contents_with_params(image: &[u8], arch: impl FnOnce() -> Option<u32>) -> Contents {
    read_contents(image, arch, true)
}

fn read_contents(image: &[u8], arch: impl FnOnce() -> Option<u32>, with_params: bool) -> Contents {
    let found = std::cell::RefCell::new(Contents::default());
    let keep = |name: String, bytes: u64| {
        let mut f = found.borrow_mut();
        let e = f.kernel_locals.entry(name).or_insert(0);
        *e = (*e).max(bytes);
    };
    let keep_params = |name: String, layout: Vec<Param>| {
        found
            .borrow_mut()
            .kernel_params
            .entry(name)
            .or_insert(layout);
    };
    for_each_entry(
        image,
        arch,
        |text| {
            ptx_globals(text, &mut found.borrow_mut().globals);
            ptx_entry_locals(text, keep);
            if with_params {
                params::ptx_params(text, keep_params);
            }
        },
        |elf| {
            elf_globals(elf, &mut found.borrow_mut().globals);
            elf_stack_sizes(elf, keep);
            if with_params {
                params::elf_params(elf, keep_params);
            }
        },
    );
    found.into_inner()
}

/// Bytes of all the global variables the image defines ([`globals`]).
#[must_use]
pub fn declared_bytes(image: &[u8], arch: impl FnOnce() -> Option<u32>) -> u64 {
    globals(image, arch)
        .values()
        .fold(0u64, |sum, b| sum.saturating_add(*b))
}

/// The `.global` variables PTX text declares at module scope (`[.visible|.extern] .global
/// [.align N] .TYPE name[D1][D2]...;`): the type's width times the dimensions. An
/// initialised one (`= {...}`) counts the same.
fn ptx_globals(text: &str, found: &mut HashMap<String, u64>) {
    for statement in text.split(';') {
        if let Some((name, bytes)) = ptx_declaration(statement, ".global") {
            found.insert(name, bytes);
        }
    }
}

/// The variable one PTX statement declares in state `space` (`.global`, `.local`), with its
/// bytes: `[.visible|.weak] SPACE [.align N] .TYPE name[D1][D2]...`, the type's width times
/// the dimensions; None for any other statement (an `.extern` one included).
fn ptx_declaration(statement: &str, space: &str) -> Option<(String, u64)> {
    // Directives without a semicolon (`.version`, `.target`, `{`) may stand on lines before.
    let from = statement
        .lines()
        .position(|l| l.split_whitespace().any(|w| w == space))?;
    let words: Vec<&str> = statement
        .lines()
        .skip(from)
        .flat_map(str::split_whitespace)
        .collect();
    let g = words.iter().position(|w| *w == space)?;
    if words[..g]
        .iter()
        .any(|w| !matches!(*w, ".visible" | ".weak"))
    {
        return None;
    }
    let mut rest = words[g + 1..].iter().copied();
    let mut width = None;
    let mut declarator = None;
    while let Some(w) = rest.next() {
        if w == ".align" {
            rest.next();
        } else if let Some(t) = w.strip_prefix('.') {
            width = t
                .get(1..)
                .and_then(|bits| bits.parse::<u64>().ok())
                .map(|b| b / 8);
        } else {
            declarator = Some(w);
            break;
        }
    }
    let (width, declarator) = (width?, declarator?);
    let declarator = declarator.split('=').next().unwrap_or(declarator);
    let (name, dims) = declarator.split_once('[').unwrap_or((declarator, ""));
    let count = dims
        .split(['[', ']'])
        .filter(|d| !d.is_empty())
        .try_fold(1u64, |n, d| n.checked_mul(d.trim().parse().ok()?))?;
    (!name.is_empty()).then(|| (name.to_string(), width.saturating_mul(count)))
}

/// The `.local` arrays each `.entry` of PTX text declares in its body (up to the next
/// `.entry` or `.func`), summed per kernel.
fn ptx_entry_locals(text: &str, mut keep: impl FnMut(String, u64)) {
    let starts_word = |s: &str, word: &str| {
        s.strip_prefix(word)
            .is_some_and(|r| r.starts_with(char::is_whitespace))
    };
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at..];
        if !starts_word(after, ".entry") {
            rest = &after[6..];
            continue;
        }
        let after = &after[6..];
        let name = after
            .split(|c: char| c.is_whitespace() || c == '(' || c == '{')
            .find(|w| !w.is_empty())
            .unwrap_or("");
        let end = [after.find(".entry"), after.find(".func")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(after.len());
        let bytes = after[..end]
            .split(';')
            .filter_map(|st| ptx_declaration(st, ".local"))
            .fold(0u64, |sum, (_, b)| sum.saturating_add(b));
        if !name.is_empty() {
            keep(name.to_string(), bytes);
        }
        rest = &after[end..];
    }
}

/// `.nv.info` attribute records: a format byte, an attribute byte, then for the sized format
/// a 16-bit length and that many bytes; every other format is 4 bytes in all.
const EIFMT_SVAL: u8 = 0x04;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;

/// The minimum stack size `ptxas` records for a function whose stack it cannot bound (a
/// recursive call chain): the driver then goes by its frame size and the context's stack
/// limit, which the program raises itself (`cudaDeviceSetLimit(cudaLimitStackSize, ...)`).
const UNKNOWN_STACK: u32 = u32::MAX;

/// The stack each function of an ELF cubin needs per thread, from its `.nv.info` section's
/// frame and minimum stack sizes ([`nv_info_stack_sizes`]), named by the symbol table.
fn elf_stack_sizes(elf: &[u8], mut keep: impl FnMut(String, u64)) {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolIndex};
    let Ok(file) = object::File::parse(elf) else {
        return;
    };
    let Some(data) = file.section_by_name(".nv.info").and_then(|s| s.data().ok()) else {
        return;
    };
    for (index, bytes) in nv_info_stack_sizes(data) {
        if let Ok(symbol) = file.symbol_by_index(SymbolIndex(index as usize))
            && let Ok(name) = symbol.name()
        {
            keep(name.to_string(), bytes);
        }
    }
}

/// Each function's (by symbol index) stack a thread, the larger of its frame size and its
/// minimum stack size where that is known, from `.nv.info` records (each a symbol index and
/// a 32-bit size).
fn nv_info_stack_sizes(data: &[u8]) -> HashMap<u32, u64> {
    let mut sizes: HashMap<u32, u64> = HashMap::new();
    let mut at = 0;
    while let (Some(&format), Some(&attribute)) = (data.get(at), data.get(at + 1)) {
        if format != EIFMT_SVAL {
            at += 4;
            continue;
        }
        let Some(len) = u16_at(data, at + 2).map(usize::from) else {
            break;
        };
        if matches!(attribute, EIATTR_FRAME_SIZE | EIATTR_MIN_STACK_SIZE)
            && len == 8
            && let (Some(symbol), Some(bytes)) = (u32_at(data, at + 4), u32_at(data, at + 8))
            && bytes != UNKNOWN_STACK
        {
            let e = sizes.entry(symbol).or_insert(0);
            *e = (*e).max(u64::from(bytes));
        }
        at += 4 + len;
    }
    sizes
}

fn elf_globals(elf: &[u8], found: &mut HashMap<String, u64>) {
    use object::{Object, ObjectSymbol, SymbolKind};
    let Ok(file) = object::File::parse(elf) else {
        return;
    };
    for symbol in file.symbols() {
        if symbol.kind() == SymbolKind::Data
            && let Ok(name) = symbol.name()
        {
            found.insert(name.to_string(), symbol.size());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer;

    #[test]
    fn a_fat_binarys_uncompressed_ptx_entries_declare_their_globals_once() {
        let ptx = b".version 7.0\n.target sm_75\n.address_size 64\n\
                    .visible .global .align 8 .b8 table[4096];\n\0";
        let hidden = b".visible .global .b8 unseen[64];\n\0";
        let fatbin = writer::fat_binary(&[
            writer::entry(ENTRY_PTX, 0, 0, ptx),
            writer::entry(ENTRY_PTX, 0, 0, ptx),
            writer::entry(ENTRY_PTX, 0, 0x2000, hidden),
        ]);
        let found = globals(&fatbin, || None);
        assert_eq!(found.get("table"), Some(&4096), "{found:?}");
        assert_eq!(
            found.len(),
            1,
            "a compressed entry is not read without an architecture: {found:?}"
        );
        // SAFETY: a whole fat binary in memory.
        assert_eq!(unsafe { bytes(fatbin.as_ptr()) }.len(), fatbin.len());
    }

    #[test]
    fn compressed_entries_are_read_for_the_architecture_the_driver_would_load() {
        let ptx = |name: &str, bytes: u32| {
            format!(
                ".version 8.0\n.target sm_80\n.address_size 64\n.visible .global .b8 {name}[{bytes}];\n\0"
            )
        };
        let (lz4, zstd) = (ptx("in_lz4", 4096), ptx("in_zstd", 8192));
        let image = writer::fat_binary(&[
            writer::compressed_entry(
                ENTRY_PTX,
                80,
                compressed::LZ4,
                &lz4_flex::block::compress(lz4.as_bytes()),
                lz4.len(),
            ),
            writer::compressed_entry(
                ENTRY_PTX,
                80,
                compressed::ZSTD,
                &ruzstd::encoding::compress_to_vec(
                    zstd.as_bytes(),
                    ruzstd::encoding::CompressionLevel::Fastest,
                ),
                zstd.len(),
            ),
        ]);
        assert!(
            globals(&image, || None).is_empty(),
            "not read without an architecture"
        );
        let found = globals(&image, || Some(86));
        assert_eq!(found.get("in_lz4"), Some(&4096), "{found:?}");
        assert_eq!(found.get("in_zstd"), Some(&8192), "{found:?}");
        assert!(
            globals(&image, || Some(75)).is_empty(),
            "PTX for a newer device is not read"
        );
    }

    #[test]
    fn the_driver_loads_the_newest_cubin_of_the_devices_major_version_else_ptx() {
        let entry = |kind, arch, flags| Entry {
            kind,
            arch,
            flags,
            payload: &[],
            size: 0,
        };
        let z = compressed::ZSTD;
        let entries = [
            entry(ENTRY_ELF, 75, 0),
            entry(ENTRY_ELF, 80, z),
            entry(ENTRY_ELF, 86, z),
            entry(ENTRY_ELF, 90, z),
            entry(ENTRY_PTX, 80, z),
        ];
        let picked = |arch| -> Vec<(u16, u32)> {
            compressed_for(&entries, arch)
                .iter()
                .map(|e| (e.kind, e.arch))
                .collect()
        };
        assert_eq!(picked(86), vec![(ENTRY_ELF, 86)]);
        assert_eq!(picked(89), vec![(ENTRY_ELF, 86)]);
        assert_eq!(picked(80), vec![(ENTRY_ELF, 80)]);
        assert_eq!(picked(90), vec![(ENTRY_ELF, 90)]);
        // The uncompressed cubin is the one loaded: nothing compressed is read.
        assert_eq!(picked(75), vec![]);
        assert_eq!(picked(70), vec![]);
        // No cubin runs on compute capability 12: the driver compiles the newest PTX.
        assert_eq!(picked(120), vec![(ENTRY_PTX, 80)]);
    }

    #[test]
    fn ptx_global_declarations_are_found_with_their_sizes_and_instructions_are_not() {
        let ptx = ".version 7.0\n.target sm_75\n.address_size 64\n\n\
                   .visible .global .align 8 .b8 blob[1048576];\n\
                   .global .u32 counter;\n\
                   .global .align 4 .f32 grid[4][8] = {0.0};\n\
                   .extern .global .b8 elsewhere[64];\n\
                   .visible .entry k() {\n ld.global.u32 %r1, [counter];\n ret;\n}\n";
        let found = globals(ptx.as_bytes(), || None);
        assert_eq!(found.get("blob"), Some(&1_048_576));
        assert_eq!(found.get("counter"), Some(&4));
        assert_eq!(found.get("grid"), Some(&128));
        assert_eq!(found.len(), 3, "{found:?}");
    }

    #[test]
    fn each_ptx_entry_needs_the_local_arrays_it_declares_and_only_those() {
        let ptx = ".version 7.0\n.target sm_75\n.address_size 64\n\n\
                   .visible .global .align 4 .b8 table[64];\n\
                   .visible .entry _Z3bigPii(\n .param .u64 p\n)\n{\n\
                   \t.local .align 16 .b8 \t__local_depot0[16384];\n\
                   \t.reg .b64 %SP;\n st.local.u32 [%rd1], %r1;\n ret;\n}\n\
                   .func helper()\n{\n .local .align 4 .b8 __local_depot1[512];\n ret;\n}\n\
                   .visible .entry _Z5smallPi(\n .param .u64 p\n)\n{\n ret;\n}\n";
        let found = contents(ptx.as_bytes(), || None).kernel_locals;
        assert_eq!(found.get("_Z3bigPii"), Some(&16_384), "{found:?}");
        assert_eq!(found.get("_Z5smallPi"), Some(&0), "{found:?}");
        assert_eq!(found.len(), 2, "a .func is not a kernel: {found:?}");
        assert_eq!(globals(ptx.as_bytes(), || None).get("table"), Some(&64));
    }

    /// A frame or minimum stack size record: format, attribute, length 8, symbol, bytes.
    fn stack_record(attribute: u8, symbol: u32, bytes: u32) -> Vec<u8> {
        let mut r = vec![EIFMT_SVAL, attribute, 8, 0];
        r.extend_from_slice(&symbol.to_le_bytes());
        r.extend_from_slice(&bytes.to_le_bytes());
        r
    }

    #[test]
    fn a_functions_stack_is_its_larger_size_and_an_unbounded_minimum_is_left_to_its_frame() {
        // As `ptxas` 11.8 wrote the CUDA sample `interval`: its recursive kernel (symbol 9)
        // has no bound on its stack (0xffffffff) and a frame of 0x818 bytes; a function
        // calling others (3) needs more than its own frame.
        let section: Vec<u8> = [
            vec![EIFMT_SVAL, 0x23, 8, 0, 9, 0, 0, 0, 0, 0, 0, 0],
            stack_record(EIATTR_MIN_STACK_SIZE, 9, u32::MAX),
            stack_record(EIATTR_FRAME_SIZE, 9, 0x818),
            stack_record(EIATTR_FRAME_SIZE, 3, 0x80),
            stack_record(EIATTR_MIN_STACK_SIZE, 3, 0x200),
            vec![0x03, 0x1b, 0xff, 0x00],
        ]
        .concat();
        let sizes = nv_info_stack_sizes(&section);
        assert_eq!(sizes.get(&9), Some(&0x818));
        assert_eq!(sizes.get(&3), Some(&0x200));
        assert_eq!(sizes.len(), 2);
    }

    #[test]
    fn an_elf_image_extends_to_its_program_headers_where_they_follow_the_section_headers() {
        // As nvJitLink lays a cubin out: the section headers (one, at 64), then the program
        // headers (one, at 128), then a section's data the headers point past (at 184).
        let mut elf = vec![0u8; 184 + 40];
        elf[..4].copy_from_slice(ELF_MAGIC);
        elf[0x20..0x28].copy_from_slice(&128u64.to_le_bytes()); // phoff
        elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes()); // shoff
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // phentsize
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // phnum
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes()); // shentsize
        elf[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes()); // shnum
        elf[64 + 4..64 + 8].copy_from_slice(&1u32.to_le_bytes()); // PROGBITS
        elf[64 + 0x18..64 + 0x20].copy_from_slice(&184u64.to_le_bytes());
        elf[64 + 0x20..64 + 0x28].copy_from_slice(&40u64.to_le_bytes());
        elf[128 + 0x20..128 + 0x28].copy_from_slice(&184u64.to_le_bytes()); // filesz
        // SAFETY: a whole ELF image in memory.
        assert_eq!(unsafe { bytes(elf.as_ptr()) }.len(), 224);
    }
}
