//! Durations as operators write them on a command line: `500ms`, `10s`, `2m`, `1h`.

use std::time::Duration;

pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 10s, 2m)"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_and_without_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert!(parse("ten").is_err());
        assert!(parse("5d").is_err());
    }
}
