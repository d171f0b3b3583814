//! Manual pages for the command-line programs, made from the same clap definitions that parse
//! their arguments (clap_mangen), so a page never describes a flag the program does not have.
//!
//! Each program answers `--generate-man DIR` as its only arguments, before its own parsing, by
//! writing its page and one page per subcommand (`gpuslice-claim.1` for `gpuslice claim`) into
//! DIR and printing their paths, the way `rg --generate man` does. The flag is not in
//! `--help`: it serves packaging (`scripts/package-deb`), not users.

use std::ffi::OsStr;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The first argument that asks a program for its manual pages.
pub const FLAG: &str = "--generate-man";

/// Writes the page of `cmd` and of each of its visible subcommands, in manual `section`
/// ("1" for user commands, "8" for daemons and administration), into `dir`. Returns the paths
/// written, the command's own page last.
pub fn write_pages(cmd: clap::Command, section: &str, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    write_tree(&cmd, section, dir, &mut written)?;
    Ok(written)
}

fn write_tree(
    cmd: &clap::Command,
    section: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, section, dir, written)?;
    }
    let page = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .manual("gpuslice")
        .source(concat!("gpuslice ", env!("CARGO_PKG_VERSION")));
    let path = dir.join(page.get_filename());
    let mut file = std::fs::File::create(&path)?;
    page.render(&mut file)?;
    file.flush()?;
    written.push(path);
    Ok(())
}

/// Called first in `main`: when the program was run as `PROGRAM --generate-man DIR`, writes
/// its pages into DIR, prints their paths and exits; otherwise returns at once.
pub fn exit_if_asked<C: clap::CommandFactory>(section: &str) {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(FLAG)) {
        return;
    }
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: {FLAG} DIR (the directory to write the manual pages in)");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    match write_pages(C::command(), section, &dir) {
        Ok(paths) => {
            for path in paths {
                println!("{}", path.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{FLAG} {}: {e}", dir.display());
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> clap::Command {
        clap::Command::new("tool")
            .version("1.2")
            .about("Does things")
            .arg(clap::Arg::new("verbose").long("verbose").help("Say more"))
            .subcommand(clap::Command::new("start").about("Starts a thing"))
            .subcommand(clap::Command::new("secret").hide(true))
    }

    #[test]
    fn a_command_gets_a_page_and_each_visible_subcommand_one_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_pages(tool(), "8", dir.path()).unwrap();
        let names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["tool-start.8", "tool.8"]);
        let page = std::fs::read_to_string(dir.path().join("tool.8")).unwrap();
        assert!(page.starts_with(".ie \\n(.g .ds Aq \\(aq"), "{page}");
        let title = page.lines().find(|l| l.starts_with(".TH")).unwrap();
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            title,
            format!(r#".TH tool 8  "gpuslice {version}" gpuslice"#)
        );
        assert!(page.contains("\\-\\-verbose"), "{page}");
        assert!(page.contains("tool\\-start(8)"), "{page}");
        let sub = std::fs::read_to_string(dir.path().join("tool-start.8")).unwrap();
        assert!(sub.contains("Starts a thing"), "{sub}");
    }

    #[test]
    fn a_directory_that_does_not_exist_is_an_error_not_a_partial_success() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let e = write_pages(tool(), "1", &missing).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
