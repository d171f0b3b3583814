//! How a process is told apart from a later one with the same pid: its start time, field 22
//! of `/proc/<pid>/stat`. Claims, usage-region slots and the simulated driver's records all
//! name processes this way. The callers read the file; this module only parses it.

/// Field 22 of a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
#[must_use]
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come field 3 (state) onwards; start time is field 22, the 20th of them.
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat =
            "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
    }
}
