//! What every package holds: the files of [`LAYOUT`] and the man pages and completions
//! ([`assets`]), and the checks `--verify` and the tests make of a package's listing and of the
//! RPM spec's `%files` against them.

use crate::{assets, LAYOUT};

/// Every packaged file, relative to `/`: path, mode, whether it is configuration.
pub fn packaged() -> Vec<(String, u32, bool)> {
    LAYOUT
        .iter()
        .map(|(dest, mode, config)| (dest.to_string(), *mode, *config))
        .chain(
            assets::packaged()
                .into_iter()
                .map(|dest| (dest, 0o644, false)),
        )
        .collect()
}

/// The packaged files that `listing` (`tar -tv`, `dpkg-deb --contents`, `rpm -qlv`: one file a
/// line, its path last) lacks, each as `prefix` and its path.
pub fn missing_from(listing: &str, prefix: &str) -> Vec<String> {
    packaged()
        .into_iter()
        .map(|(dest, _, _)| format!("{prefix}{dest}"))
        .filter(|want| {
            !listing
                .lines()
                .any(|l| l.trim_end().ends_with(want.as_str()))
        })
        .collect()
}

/// The packaged files that no line of the `%files` section of the RPM spec `spec` names: by
/// its path, a glob of it (`*` within one path segment) or a directory above it (`%dir` names
/// the directory alone).
pub fn not_in_rpm_files(spec: &str) -> Vec<String> {
    let mut entries = Vec::new();
    let mut in_files = false;
    for line in spec.lines().map(str::trim) {
        if line.starts_with('%') && !line.starts_with("%files") && is_section(line) {
            in_files = false;
        }
        if line.starts_with("%files") {
            in_files = true;
            continue;
        }
        if !in_files || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut rest = line;
        let mut dir_only = false;
        while let Some(directive) = rest.strip_prefix('%') {
            let word: String = directive
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            dir_only |= word == "dir";
            let mut after = &directive[word.len()..];
            if after.starts_with('(') {
                after = after.find(')').map_or("", |end| &after[end + 1..]);
            }
            rest = after.trim_start();
        }
        if !rest.is_empty() {
            entries.push((rest.to_string(), dir_only));
        }
    }
    packaged()
        .into_iter()
        .map(|(dest, _, _)| format!("/{dest}"))
        .filter(|path| {
            !entries.iter().any(|(entry, dir_only)| {
                glob_matches(entry, path)
                    || (!dir_only && path.starts_with(&format!("{}/", entry.trim_end_matches('/'))))
            })
        })
        .collect()
}

/// Whether a line of a spec starts a section (`%install`, `%post`, `%changelog`, ...), which
/// ends `%files`.
fn is_section(line: &str) -> bool {
    const SECTIONS: [&str; 13] = [
        "%description",
        "%prep",
        "%build",
        "%install",
        "%check",
        "%clean",
        "%pre",
        "%post",
        "%preun",
        "%postun",
        "%pretrans",
        "%posttrans",
        "%changelog",
    ];
    let word = line.split_whitespace().next().unwrap_or_default();
    SECTIONS.contains(&word)
}

/// `pattern` with `*` standing for any text without a `/`, matched against the whole of `path`.
fn glob_matches(pattern: &str, path: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == path,
        Some((head, tail)) => {
            let Some(rest) = path.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .take_while(|&i| !rest[..i].contains('/'))
                .any(|i| glob_matches(tail, &rest[i..]))
        }
    }
}
