//! Where each parameter of a kernel lies in the parameter block the driver passes it: its
//! offset and size, as `cuFuncGetParamInfo` and `cuKernelGetParamInfo` (CUDA 12.4) report
//! them. An ELF cubin states it in each kernel's `.nv.info.<kernel>` section
//! (`EIATTR_KPARAM_INFO` records, which `ptxas` writes); PTX text states each parameter's type
//! and alignment in its `.entry` list, from which the layout follows as `ptxas` lays it out:
//! each parameter at the next offset its alignment allows (verified against `ptxas` 12.9).

use crate::image::{u16_at, u32_at};

/// One kernel parameter: its byte offset in the parameter block and its size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub offset: u64,
    pub size: u64,
}

/// `.nv.info` attribute records: a format byte, an attribute byte, then for the sized format a
/// 16-bit length and that many bytes; every other format is 4 bytes in all.
const EIFMT_SVAL: u8 = 0x04;
/// A parameter's record: 4 bytes of index (0), its ordinal (16 bits), its offset (16 bits),
/// then a word whose top 14 bits are its size (the low bits say which constant bank holds it).
const EIATTR_KPARAM_INFO: u8 = 0x17;

/// The parameters one `.nv.info.<kernel>` section's records describe, in ordinal order
/// (`ptxas` writes them last to first). None where an ordinal is missing or repeated: a layout
/// with holes is not reported rather than reported wrong.
#[must_use]
pub fn nv_info_params(section: &[u8]) -> Option<Vec<Param>> {
    let mut found: Vec<(u16, Param)> = Vec::new();
    let mut at = 0;
    while let (Some(&format), Some(&attribute)) = (section.get(at), section.get(at + 1)) {
        if format != EIFMT_SVAL {
            at += 4;
            continue;
        }
        let len = usize::from(u16_at(section, at + 2)?);
        if attribute == EIATTR_KPARAM_INFO && len == 12 {
            let ordinal = u16_at(section, at + 8)?;
            let offset = u16_at(section, at + 10)?;
            let word = u32_at(section, at + 12)?;
            found.push((
                ordinal,
                Param {
                    offset: u64::from(offset),
                    size: u64::from(word >> 18),
                },
            ));
        }
        at += 4 + len;
    }
    found.sort_by_key(|(ordinal, _)| *ordinal);
    found
        .iter()
        .enumerate()
        .all(|(i, (ordinal, _))| usize::from(*ordinal) == i)
        .then(|| found.into_iter().map(|(_, p)| p).collect())
}

/// Each kernel's parameters in an ELF cubin, from its `.nv.info.<kernel>` section.
pub(crate) fn elf_params(elf: &[u8], mut keep: impl FnMut(String, Vec<Param>)) {
    use object::{Object, ObjectSection};
    let Ok(file) = object::File::parse(elf) else {
        return;
    };
    for section in file.sections() {
        if let Ok(name) = section.name()
            && let Some(kernel) = name.strip_prefix(".nv.info.")
            && let Ok(data) = section.data()
            && let Some(params) = nv_info_params(data)
        {
            keep(kernel.to_string(), params);
        }
    }
}

/// Each `.entry`'s parameters in PTX text. A kernel with a parameter whose type is not a
/// plain one (`.pred`, an unknown type) is left out.
pub(crate) fn ptx_params(text: &str, mut keep: impl FnMut(String, Vec<Param>)) {
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        rest = after;
        if !after.starts_with(char::is_whitespace) {
            continue;
        }
        let after = after.trim_start();
        let name_end = after
            .find(|c: char| c.is_whitespace() || c == '(' || c == '{')
            .unwrap_or(after.len());
        let name = &after[..name_end];
        let tail = after[name_end..].trim_start();
        let list = if let Some(open) = tail.strip_prefix('(') {
            let Some(close) = open.find(')') else {
                return;
            };
            &open[..close]
        } else {
            ""
        };
        if !name.is_empty()
            && let Some(params) = ptx_param_list(list)
        {
            keep(name.to_string(), params);
        }
    }
}

/// The layout of one `.entry`'s parameter list (the text between its parentheses).
fn ptx_param_list(list: &str) -> Option<Vec<Param>> {
    let list: String = list
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut params = Vec::new();
    let mut end = 0u64;
    for declaration in list.split(',') {
        if declaration.trim().is_empty() {
            continue;
        }
        let (size, align) = ptx_param(declaration)?;
        let offset = end.div_ceil(align).checked_mul(align)?;
        end = offset.checked_add(size)?;
        params.push(Param { offset, size });
    }
    Some(params)
}

/// The size and alignment of one parameter declaration: `.param [.align N] .TYPE
/// [.ptr [.SPACE] [.align M]] name[D]...`. The alignment is `N` where given, else the type's
/// width (`M` is the pointee's and does not move the parameter).
fn ptx_param(declaration: &str) -> Option<(u64, u64)> {
    let mut words = declaration.split_whitespace();
    if words.next()? != ".param" {
        return None;
    }
    let mut align = None;
    let mut width = None;
    let mut declarator = None;
    while let Some(w) = words.next() {
        if w == ".align" {
            let n: u64 = words.next()?.parse().ok()?;
            if width.is_none() {
                align = Some(n);
            }
        } else if w == ".ptr" || width.is_some() && w.starts_with('.') {
            // The pointer's attributes: its state space and the pointee's alignment.
        } else if let Some(t) = w.strip_prefix('.') {
            width = Some(ptx_type_bytes(t)?);
        } else {
            declarator = Some(w);
            break;
        }
    }
    let width = width?;
    let count = declarator?
        .split(['[', ']'])
        .skip(1)
        .filter(|d| !d.trim().is_empty())
        .try_fold(1u64, |n, d| n.checked_mul(d.trim().parse().ok()?))?;
    let align = align.unwrap_or(width).max(1);
    Some((width.checked_mul(count)?, align))
}

/// Bytes of a PTX fundamental type usable as a kernel parameter (`b32`, `f16x2`, `texref`).
fn ptx_type_bytes(t: &str) -> Option<u64> {
    match t {
        "texref" | "samplerref" | "surfref" => return Some(8),
        "f16x2" | "bf16x2" => return Some(4),
        _ => {}
    }
    let bits = t.strip_prefix("bf").or_else(|| t.get(1..))?;
    if !matches!(t.as_bytes().first(), Some(b'b' | b'u' | b's' | b'f')) {
        return None;
    }
    match bits.parse::<u64>().ok()? {
        b @ (8 | 16 | 32 | 64) => Some(b / 8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(params: &[Param]) -> Vec<(u64, u64)> {
        params.iter().map(|p| (p.offset, p.size)).collect()
    }

    fn ptx(text: &str) -> std::collections::HashMap<String, Vec<(u64, u64)>> {
        let mut found = std::collections::HashMap::new();
        ptx_params(text, |name, params| {
            found.insert(name, layout(&params));
        });
        found
    }

    #[test]
    fn ptx_parameters_lie_at_the_offsets_ptxas_gives_them() {
        // `ptxas` 12.9 put these at 0, 8, 16, 32, 56, 60 and 64 (its EIATTR_KPARAM_INFO).
        let found = ptx(".version 7.8\n.target sm_86\n.address_size 64\n\
             .visible .entry mixed(\n\
             \t.param .u64 .ptr .global .align 16 mixed_param_0, // a pointer\n\
             \t.param .u8 mixed_param_1,\n\
             \t.param .f64 mixed_param_2,\n\
             \t.param .align 16 .b8 mixed_param_3[24],\n\
             \t.param .u16 mixed_param_4,\n\
             \t.param .f16x2 mixed_param_5,\n\
             \t.param .align 4 .b8 mixed_param_6[3]\n\
             )\n{\n\tret;\n}\n\
             .visible .entry none()\n{\n\tret;\n}\n\
             .entry bare {\n\tret;\n}\n");
        assert_eq!(
            found["mixed"],
            [(0, 8), (8, 1), (16, 8), (32, 24), (56, 2), (60, 4), (64, 3)]
        );
        assert_eq!(found["none"], []);
        assert_eq!(found["bare"], []);
        assert_eq!(found.len(), 3);
    }

    #[test]
    fn a_ptx_kernel_with_a_parameter_of_no_plain_type_is_left_out() {
        let found = ptx(
            ".visible .entry odd(.param .pred p, .param .u32 n) { ret; }\n\
             .visible .entry fine(.param .s32 n, .param .texref t) { ret; }\n\
             .func notakernel(.param .b32 x) { ret; }\n",
        );
        assert!(!found.contains_key("odd"));
        assert_eq!(found["fine"], [(0, 4), (8, 8)]);
        assert_eq!(found.len(), 1);
    }

    /// A KPARAM_INFO record as `ptxas` 12.9 writes it: format, attribute, length 12, index 0,
    /// ordinal, offset, and the word with the size in its top 14 bits (constant bank 0x1f).
    fn record(ordinal: u16, offset: u16, size: u32) -> Vec<u8> {
        let mut r = vec![EIFMT_SVAL, EIATTR_KPARAM_INFO, 12, 0, 0, 0, 0, 0];
        r.extend_from_slice(&ordinal.to_le_bytes());
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&(size << 18 | 0x1f000).to_le_bytes());
        r
    }

    #[test]
    fn a_cubins_parameter_records_give_the_layout_in_ordinal_order() {
        // As `ptxas` wrote `mixed` above: other records around, parameters last to first;
        // 0x21f000 is the word it wrote for an 8-byte parameter.
        let mut section = vec![EIFMT_SVAL, 0x37, 4, 0, 0x81, 0, 0, 0, 0x01, 0x35, 0, 0];
        for (ordinal, offset, size) in [(6, 64, 3), (5, 60, 4), (4, 56, 2), (3, 32, 24)] {
            section.extend(record(ordinal, offset, size));
        }
        section.extend(record(2, 16, 8));
        section.extend(record(1, 8, 1));
        section.extend(record(0, 0, 8));
        section.extend([0x03, 0x1b, 0xff, 0x00]);
        assert_eq!(u32_at(&record(0, 0, 8), 12), Some(0x21f000));
        let params = nv_info_params(&section).expect("a whole layout");
        assert_eq!(
            layout(&params),
            [(0, 8), (8, 1), (16, 8), (32, 24), (56, 2), (60, 4), (64, 3)]
        );
        assert_eq!(nv_info_params(&[0x03, 0x1b, 0xff, 0x00]), Some(vec![]));
    }

    #[test]
    fn a_cubin_layout_with_a_missing_or_repeated_ordinal_or_a_cut_record_is_not_reported() {
        let holes: Vec<u8> = [record(0, 0, 8), record(2, 16, 8)].concat();
        assert_eq!(nv_info_params(&holes), None);
        let twice: Vec<u8> = [record(0, 0, 8), record(0, 0, 8)].concat();
        assert_eq!(nv_info_params(&twice), None);
        let cut = &record(0, 0, 8)[..9];
        assert_eq!(nv_info_params(cut), None);
    }
}
