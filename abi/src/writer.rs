//! Writing fat binaries as `nvcc` lays them out, the layout [`crate::image`] reads: for the
//! tests of the readers (this crate's, the interception library's), behind the `testing`
//! feature.

use crate::image::{ENTRY_ELF, ENTRY_PTX, FATBIN_MAGIC};

/// The kinds of entry: PTX text and an ELF cubin.
pub const PTX: u16 = ENTRY_PTX;
pub const ELF: u16 = ENTRY_ELF;

/// An entry for architecture `arch` (10 × major + minor) holding `payload` as it is: a 64-byte
/// header (kind, version 1, the header's size, the payload's size, the architecture at byte
/// 28, `flags` at byte 40), then the payload.
#[must_use]
pub fn entry(kind: u16, arch: u32, flags: u64, payload: &[u8]) -> Vec<u8> {
    let mut e = vec![0u8; 64];
    e[0..2].copy_from_slice(&kind.to_le_bytes());
    e[2..4].copy_from_slice(&1u16.to_le_bytes());
    e[4..8].copy_from_slice(&64u32.to_le_bytes());
    e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    e[28..32].copy_from_slice(&arch.to_le_bytes());
    e[40..48].copy_from_slice(&flags.to_le_bytes());
    e.extend_from_slice(payload);
    e
}

/// An entry whose payload `compressed` is `size` bytes once decompressed as `flags` say
/// ([`crate::compressed::LZ4`], [`crate::compressed::ZSTD`]): the compressed size at byte
/// 16, the uncompressed one at byte 56, the payload padded to 8 bytes.
#[must_use]
pub fn compressed_entry(
    kind: u16,
    arch: u32,
    flags: u64,
    compressed: &[u8],
    size: usize,
) -> Vec<u8> {
    let padded = compressed.len().next_multiple_of(8);
    let mut e = entry(
        kind,
        arch,
        flags,
        &[compressed, &vec![0; padded - compressed.len()]].concat(),
    );
    e[16..20].copy_from_slice(&(compressed.len() as u32).to_le_bytes());
    e[56..64].copy_from_slice(&(size as u64).to_le_bytes());
    e
}

/// A fat binary of `entries`: a 16-byte header (magic, version 1, the header's size, the
/// entries' size), then the entries.
#[must_use]
pub fn fat_binary(entries: &[Vec<u8>]) -> Vec<u8> {
    let entries = entries.concat();
    let mut image = vec![0u8; 16];
    image[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
    image[4..6].copy_from_slice(&1u16.to_le_bytes());
    image[6..8].copy_from_slice(&16u16.to_le_bytes());
    image[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    image.extend_from_slice(&entries);
    image
}
