//! Fat binary entries `nvcc` compressed, as the driver decompresses them before it loads one:
//! an LZ4 block (flag `0x2000`, what `nvcc` did by default through CUDA 12.3, and most of
//! PyTorch's and cuBLAS's kernels) or a Zstandard frame (flag `0x8000`, `-compress-mode` from
//! CUDA 12.4: cuBLAS 12.8's entries for its newer architectures). The entry header holds the
//! compressed size (bytes 16..20) and the uncompressed one (bytes 56..64), as public analyses
//! of `cuobjdump` describe it; the driver does not document the layout.

use std::io::Read;

/// The entry flag of an LZ4 block.
pub const LZ4: u64 = 0x2000;
/// The entry flag of a Zstandard frame.
pub const ZSTD: u64 = 0x8000;

/// No entry of a real module comes near this; an image claiming more is not read (the
/// process would only allocate it for nothing: the driver refuses such an image).
const LARGEST: u64 = 1 << 30;
/// LZ4 cannot expand a block more than this (a match of at most 255 bytes per byte and more).
const LZ4_MOST_RATIO: usize = 256;

/// The entry compressed in `data` as `flags` say, `size` bytes uncompressed; None where it is
/// not compressed, or not a whole compressed entry of that size.
#[must_use]
pub fn decompress(flags: u64, data: &[u8], size: u64) -> Option<Vec<u8>> {
    if size == 0 || size > LARGEST {
        return None;
    }
    let size = usize::try_from(size).ok()?;
    let out = if flags & LZ4 != 0 {
        if size > data.len().saturating_mul(LZ4_MOST_RATIO) {
            return None;
        }
        lz4_flex::block::decompress(data, size).ok()?
    } else if flags & ZSTD != 0 {
        let mut out = Vec::with_capacity(size.min(data.len().saturating_mul(16)));
        // One byte more than the size, to tell a frame that holds more from a whole one.
        ruzstd::decoding::StreamingDecoder::new(data)
            .ok()?
            .take(size as u64 + 1)
            .read_to_end(&mut out)
            .ok()?;
        out
    } else {
        return None;
    };
    (out.len() == size).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lz4_and_zstandard_entries_come_back_whole_and_a_wrong_size_is_refused() {
        let text: Vec<u8> = b"\x7fELF".iter().chain(&[7u8; 5000]).copied().collect();
        let lz4 = lz4_flex::block::compress(&text);
        assert!(decompress(LZ4, &lz4, text.len() as u64) == Some(text.clone()));
        let zstd = ruzstd::encoding::compress_to_vec(
            &text[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert!(decompress(ZSTD, &zstd, text.len() as u64) == Some(text.clone()));
        for (flags, data) in [(LZ4, &lz4), (ZSTD, &zstd)] {
            let n = text.len() as u64;
            assert!(
                decompress(flags, data, n + 1).is_none(),
                "{flags:#x}: one byte more"
            );
            assert!(
                decompress(flags, data, n - 1).is_none(),
                "{flags:#x}: one byte less"
            );
            assert!(
                decompress(flags, data, LARGEST + 1).is_none(),
                "{flags:#x}: too large"
            );
            let half = &data[..data.len() / 2];
            assert!(
                decompress(flags, half, n).is_none(),
                "{flags:#x}: truncated"
            );
        }
        assert!(
            decompress(0, &text, text.len() as u64).is_none(),
            "not compressed"
        );
    }
}
