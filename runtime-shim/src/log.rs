//! Errors where runc's callers look for them: the `--log` file, one JSON object a line in
//! runc's format (`{"level":"error","msg":"…","time":"…"}`) or logrus text, and stderr.

use std::io::Write;
use std::path::Path;

/// RFC 3339 UTC time with nanoseconds, as logrus writes it.
#[must_use]
pub fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = i64::try_from(now.as_secs()).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_nanos()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// One error line in `format` (`json` or `text`).
#[must_use]
pub fn line(format: Option<&str>, msg: &str) -> String {
    line_at("error", format, msg)
}

/// One line of `level` in `format` (`json` or `text`).
fn line_at(level: &str, format: Option<&str>, msg: &str) -> String {
    let time = rfc3339_now();
    if format == Some("json") {
        serde_json::json!({"level": level, "msg": msg, "time": time}).to_string()
    } else {
        format!(
            "time=\"{time}\" level={level} msg={}",
            serde_json::Value::String(msg.to_string())
        )
    }
}

/// Writes a warning to the log file (appending) and to stderr.
pub fn warn(log: Option<&Path>, format: Option<&str>, msg: &str) {
    write(log, &line_at("warning", format, msg));
    eprintln!("gpuslice-runtime: warning: {msg}");
}

fn write(log: Option<&Path>, line: &str) {
    if let Some(path) = log
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Writes `msg` to the log file (appending) and to stderr.
pub fn error(log: Option<&Path>, format: Option<&str>, msg: &str) {
    write(log, &line(format, msg));
    eprintln!("gpuslice-runtime: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_have_runcs_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&line(Some("json"), "bad \"memory\"")).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "bad \"memory\"");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn dates_are_converted_from_days_since_the_epoch() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(20_516), (2026, 3, 4));
    }
}
