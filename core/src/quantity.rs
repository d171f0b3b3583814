//! Sizes of device memory as users write them: bytes, Kubernetes-style suffixes, or a share
//! of the card in percent.

use serde::{Deserialize, Serialize};

/// A memory request per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryQuantity {
    /// An exact number of bytes.
    Bytes(u64),
    /// A share of the card's memory in hundredths of a percent (2500 = 25%).
    PercentBasisPoints(u32),
}

impl MemoryQuantity {
    /// The bytes this quantity means on a card with `total` bytes. Percentages round down to
    /// a whole MiB so that slices line up with what allocators hand out.
    #[must_use]
    pub fn bytes_of(self, total: u64) -> u64 {
        match self {
            Self::Bytes(b) => b,
            Self::PercentBasisPoints(bp) => {
                const MIB: u64 = 1 << 20;
                // In u64 where it fits (every real GPU): placement asks this in its inner loops.
                match total.checked_mul(u64::from(bp)) {
                    Some(p) => p / 10_000 / MIB * MIB,
                    None => {
                        let raw = u128::from(total) * u128::from(bp) / 10_000;
                        u64::try_from(raw / u128::from(MIB) * u128::from(MIB)).unwrap_or(u64::MAX)
                    }
                }
            }
        }
    }
}

impl std::fmt::Display for MemoryQuantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "{}", format_bytes(*b)),
            Self::PercentBasisPoints(bp) if bp % 100 == 0 => write!(f, "{}%", bp / 100),
            Self::PercentBasisPoints(bp) => write!(f, "{}.{:02}%", bp / 100, bp % 100),
        }
    }
}

/// Why a quantity could not be read. The caller adds which input it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty value")]
    Empty,
    #[error("negative sizes are not allowed")]
    Negative,
    #[error("must be greater than zero")]
    Zero,
    #[error("not a number followed by an optional unit (B, Ki, Mi, Gi, Ti, k, M, G, T or %)")]
    Syntax,
    #[error("unknown unit {0:?} (use Ki, Mi, Gi, Ti, k, M, G, T or %)")]
    Unit(String),
    #[error("too large")]
    Overflow,
    #[error("is not a whole number of bytes")]
    Fraction,
    #[error("a percentage must be at most 100%")]
    PercentOver100,
    #[error("a percentage allows at most two decimal places")]
    PercentPrecision,
}

const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("k", 1_000),
    ("K", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
];

/// Reads `2Gi`, `1536Mi`, `2147483648`, `1.5Gi`, `25%`.
pub fn parse_memory(input: &str) -> Result<MemoryQuantity, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.starts_with('-') {
        return Err(QuantityError::Negative);
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let (int_part, frac_part) = split_decimal(number)?;
    if unit == "%" {
        if frac_part.len() > 2 {
            return Err(QuantityError::PercentPrecision);
        }
        let int: u64 = int_part.parse().map_err(|_| QuantityError::Overflow)?;
        let frac: u64 = format!("{frac_part:0<2}").parse().unwrap_or(0);
        let bp = int.checked_mul(100).and_then(|v| v.checked_add(frac));
        let bp = bp.ok_or(QuantityError::PercentOver100)?;
        if bp == 0 {
            return Err(QuantityError::Zero);
        }
        if bp > 10_000 {
            return Err(QuantityError::PercentOver100);
        }
        return Ok(MemoryQuantity::PercentBasisPoints(
            u32::try_from(bp).map_err(|_| QuantityError::PercentOver100)?,
        ));
    }
    let multiplier = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, m)| *m)
        .ok_or_else(|| QuantityError::Unit(unit.to_string()))?;
    let int: u128 = int_part.parse().map_err(|_| QuantityError::Overflow)?;
    let frac_digits = u32::try_from(frac_part.len()).map_err(|_| QuantityError::Overflow)?;
    if frac_digits > 18 {
        return Err(QuantityError::Fraction);
    }
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().map_err(|_| QuantityError::Syntax)?
    };
    let scale = 10u128.pow(frac_digits);
    let m = u128::from(multiplier);
    let whole = int.checked_mul(m).ok_or(QuantityError::Overflow)?;
    let frac_bytes_scaled = frac.checked_mul(m).ok_or(QuantityError::Overflow)?;
    if frac_bytes_scaled % scale != 0 {
        return Err(QuantityError::Fraction);
    }
    let total = whole
        .checked_add(frac_bytes_scaled / scale)
        .ok_or(QuantityError::Overflow)?;
    let total = u64::try_from(total).map_err(|_| QuantityError::Overflow)?;
    if total == 0 {
        return Err(QuantityError::Zero);
    }
    Ok(MemoryQuantity::Bytes(total))
}

fn split_decimal(number: &str) -> Result<(&str, &str), QuantityError> {
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    let digits = |p: &str| p.chars().all(|c| c.is_ascii_digit());
    if int_part.is_empty() || !digits(int_part) || !digits(frac_part) || number.ends_with('.') {
        return Err(QuantityError::Syntax);
    }
    Ok((int_part, frac_part))
}

/// Formats bytes with the largest binary unit that divides them exactly (`2Gi`, `1536Mi`).
#[must_use]
pub fn format_bytes(bytes: u64) -> String {
    for (name, m) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes >= m && bytes.is_multiple_of(m) {
            return format!("{}{name}", bytes / m);
        }
    }
    bytes.to_string()
}

/// Formats bytes for people, rounded to one decimal (`7.5 GiB`).
#[must_use]
pub fn human_bytes(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    for (name, m) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        #[allow(clippy::cast_precision_loss)]
        let mf = m as f64;
        if b >= mf {
            return format!("{:.1} {name}", b / mf);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_suffixes_give_exact_bytes() {
        assert_eq!(parse_memory("2Gi"), Ok(MemoryQuantity::Bytes(2 << 30)));
        assert_eq!(
            parse_memory("1536Mi"),
            Ok(MemoryQuantity::Bytes(1536 << 20))
        );
        assert_eq!(parse_memory("1.5Gi"), Ok(MemoryQuantity::Bytes(3 << 29)));
        assert_eq!(parse_memory("2G"), Ok(MemoryQuantity::Bytes(2_000_000_000)));
        assert_eq!(parse_memory("4096"), Ok(MemoryQuantity::Bytes(4096)));
        assert_eq!(parse_memory(" 7.5Gi "), Ok(MemoryQuantity::Bytes(15 << 29)));
    }

    #[test]
    fn percentages_are_kept_in_basis_points() {
        assert_eq!(
            parse_memory("25%"),
            Ok(MemoryQuantity::PercentBasisPoints(2500))
        );
        assert_eq!(
            parse_memory("12.5%"),
            Ok(MemoryQuantity::PercentBasisPoints(1250))
        );
        assert_eq!(
            parse_memory("100%"),
            Ok(MemoryQuantity::PercentBasisPoints(10_000))
        );
        assert_eq!(
            MemoryQuantity::PercentBasisPoints(5000).bytes_of(16 << 30),
            8 << 30
        );
    }

    #[test]
    fn malformed_sizes_are_refused_with_a_reason() {
        assert_eq!(parse_memory(""), Err(QuantityError::Empty));
        assert_eq!(parse_memory("-1Gi"), Err(QuantityError::Negative));
        assert_eq!(parse_memory("0"), Err(QuantityError::Zero));
        assert_eq!(parse_memory("0Mi"), Err(QuantityError::Zero));
        assert_eq!(parse_memory("0%"), Err(QuantityError::Zero));
        assert_eq!(parse_memory("2Gb"), Err(QuantityError::Unit("Gb".into())));
        assert_eq!(parse_memory("Gi"), Err(QuantityError::Syntax));
        assert_eq!(parse_memory("1..5Gi"), Err(QuantityError::Syntax));
        assert_eq!(parse_memory("1.Gi"), Err(QuantityError::Syntax));
        assert_eq!(parse_memory("0.3"), Err(QuantityError::Fraction));
        assert_eq!(parse_memory("101%"), Err(QuantityError::PercentOver100));
        assert_eq!(parse_memory("1.125%"), Err(QuantityError::PercentPrecision));
        assert_eq!(
            parse_memory("99999999999999999999Ti"),
            Err(QuantityError::Overflow)
        );
        assert_eq!(parse_memory("20000000Ti"), Err(QuantityError::Overflow));
    }

    #[test]
    fn bytes_format_back_to_their_shortest_exact_form() {
        assert_eq!(format_bytes(2 << 30), "2Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(human_bytes(15 << 29), "7.5 GiB");
    }
}
