//! Reading the files a process writes while it runs: a log from an offset (the part a restart or
//! a phase added), its length, and its last lines for failure messages.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The length of `path` in bytes, 0 when it does not exist: the offset to read a later part from.
pub fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The text of `path` from byte `offset` on, empty when it cannot be read.
pub fn read_from(path: &Path, offset: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let _ = f.seek(SeekFrom::Start(offset));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

/// The last `lines` lines of `path`, empty when it cannot be read.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_read_from_an_offset_and_by_its_tail() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let path = dir.path().join("x.log");
        assert_eq!(len(&path), 0);
        assert_eq!(read_from(&path, 0), "");
        assert_eq!(tail(&path, 3), "");
        std::fs::write(&path, "one\ntwo\n").expect("writing the log");
        let offset = len(&path);
        assert_eq!(offset, 8);
        std::fs::write(&path, "one\ntwo\nthree\nfour\n").expect("writing the log");
        assert_eq!(read_from(&path, offset), "three\nfour\n");
        assert_eq!(tail(&path, 2), "three\nfour");
        assert_eq!(tail(&path, 10), "one\ntwo\nthree\nfour");
    }
}
