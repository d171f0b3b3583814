//! What reading a module image's globals costs, as the interception library does before each
//! module load: a fat binary of PTX entries stored plain, LZ4-compressed and
//! Zstandard-compressed (as `nvcc` writes them), side by side in one process, each round
//! alternating the three; the compressed ones also when no architecture is known (nothing
//! decompressed). With `GPUSLICE_BENCH_LIBRARY=<a shared library>`, every fat binary in it is
//! read as the simulated driver reads them at registration, for compute capability 8.6 and
//! 9.0 (libcublasLt: what its start costs there).
//!
//! Run: `cargo bench -p gpuslice-cuda-abi --bench image`
//! Each figure is the median over the rounds.

use std::time::Instant;

use gpuslice_cuda_abi::image;

const ROUNDS: usize = 15;
const ENTRIES: usize = 64;

fn ptx(i: usize) -> Vec<u8> {
    let mut text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .global .b8 table_{i}[4096];\n"
    );
    for k in 0..1500 {
        text.push_str(&format!(
            ".visible .entry kernel_{i}_{k}(.param .u64 p)\n{{\n ret;\n}}\n"
        ));
    }
    text.push('\0');
    text.into_bytes()
}

/// A fat binary of `ENTRIES` PTX entries for compute capability 8.0, each stored as `flags`
/// say (0: plain).
fn fat_binary(flags: u64) -> Vec<u8> {
    let mut entries = Vec::new();
    for i in 0..ENTRIES {
        let text = ptx(i);
        let data = match flags {
            0 => text.clone(),
            gpuslice_cuda_abi::compressed::LZ4 => lz4_flex::block::compress(&text),
            _ => ruzstd::encoding::compress_to_vec(
                &text[..],
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
        };
        let padded = data.len().next_multiple_of(8);
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&1u16.to_le_bytes());
        e[4..8].copy_from_slice(&64u32.to_le_bytes());
        e[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
        e[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        e[28..32].copy_from_slice(&80u32.to_le_bytes());
        e[40..48].copy_from_slice(&flags.to_le_bytes());
        e[56..64].copy_from_slice(&(text.len() as u64).to_le_bytes());
        e.extend_from_slice(&data);
        e.resize(64 + padded, 0);
        entries.extend_from_slice(&e);
    }
    let mut image = vec![0u8; 16];
    image[0..4].copy_from_slice(&0xBA55_ED50u32.to_le_bytes());
    image[4..6].copy_from_slice(&1u16.to_le_bytes());
    image[6..8].copy_from_slice(&16u16.to_le_bytes());
    image[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    image.extend_from_slice(&entries);
    image
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(f: impl FnOnce() -> u64) -> f64 {
    let t = Instant::now();
    std::hint::black_box(f());
    t.elapsed().as_secs_f64() * 1e3
}

/// The fat binaries in a shared library's bytes.
fn fat_binaries(file: &[u8]) -> Vec<&[u8]> {
    let magic = 0xBA55_ED50u32.to_le_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = file[at..].windows(4).position(|w| w == magic) {
        let start = at + i;
        let header = |o: usize, n: usize| file.get(start + o..start + o + n);
        let version = header(4, 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let size = header(8, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
        match (version, header(6, 2), size) {
            (Some(1), Some([16, 0]), Some(size)) if start + 16 + size <= file.len() => {
                out.push(&file[start..start + 16 + size]);
                at = start + 16 + size;
            }
            _ => at = start + 4,
        }
    }
    out
}

fn main() {
    let (plain, lz4, zstd) = (
        fat_binary(0),
        fat_binary(gpuslice_cuda_abi::compressed::LZ4),
        fat_binary(gpuslice_cuda_abi::compressed::ZSTD),
    );
    let declared = |image: &[u8], arch: Option<u32>| image::declared_bytes(image, || arch);
    assert_eq!(declared(&plain, Some(86)), declared(&lz4, Some(86)));
    assert_eq!(declared(&plain, Some(86)), declared(&zstd, Some(86)));
    let (mut p, mut l, mut z, mut none) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        p.push(time(|| declared(&plain, Some(86))));
        l.push(time(|| declared(&lz4, Some(86))));
        z.push(time(|| declared(&zstd, Some(86))));
        none.push(time(|| declared(&lz4, None)));
    }
    let (p, l, z, none) = (median(p), median(l), median(z), median(none));
    println!(
        "fat binary of {ENTRIES} PTX entries, {:.1} MiB plain ({:.2} MiB LZ4, {:.2} MiB Zstandard)",
        plain.len() as f64 / (1 << 20) as f64,
        lz4.len() as f64 / (1 << 20) as f64,
        zstd.len() as f64 / (1 << 20) as f64,
    );
    println!("  plain        {p:8.2} ms");
    println!("  LZ4          {l:8.2} ms  ({:.2}x plain)", l / p);
    println!("  Zstandard    {z:8.2} ms  ({:.2}x plain)", z / p);
    println!("  LZ4, no arch {none:8.2} ms  ({:.2}x plain)", none / p);

    if let Some(path) = std::env::var_os("GPUSLICE_BENCH_LIBRARY") {
        let file = std::fs::read(&path).expect("GPUSLICE_BENCH_LIBRARY");
        let fatbins = fat_binaries(&file);
        for arch in [86, 90] {
            let runs: Vec<f64> = (0..3)
                .map(|_| {
                    time(|| {
                        fatbins
                            .iter()
                            .map(|f| image::contents(f, || Some(arch)).globals.len() as u64)
                            .sum()
                    })
                })
                .collect();
            println!(
                "{}: {} fat binaries, every one read for compute capability {}.{}: {:.0} ms",
                std::path::Path::new(&path).display(),
                fatbins.len(),
                arch / 10,
                arch % 10,
                median(runs)
            );
        }
    }
}
