//! A small file (a key, a token, a webhook secret) read again only when it changed: at most one
//! `stat` every [`RECHECK`], not an open and a read for every use, so a file rotated by
//! a rename or rewritten in place takes effect within [`RECHECK`] without a restart.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a file's last look stands before the next use looks again: a rotated file is used
/// at most this long after it changed. At thousands of uses a second a `stat` per use was a
/// measurable part of a node's cycle; once in a tenth of a second is not.
pub const RECHECK: Duration = Duration::from_millis(100);

/// What identifies one version of a file without reading it: device and inode (a file replaced
/// by a rename), size, and modification and change times to the nanosecond (a file rewritten in
/// place).
pub type FileStamp = (u64, u64, u64, i64, i64, i64, i64);

/// The [`FileStamp`] of a file's metadata.
pub fn file_stamp(m: &std::fs::Metadata) -> FileStamp {
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// A file and what was last made of its content, kept until its [`FileStamp`] changes, and
/// served without looking at the file for [`RECHECK`] after the last look. Its `Debug` shows the
/// path only: the content may be a secret.
pub struct ChangedFile<T> {
    path: PathBuf,
    max_len: u64,
    recheck: Duration,
    last: Mutex<Option<Last<T>>>,
}

/// The last successful load: the stamp it was made from, what was made of it, and when the file
/// was last found to still have that stamp.
struct Last<T> {
    stamp: FileStamp,
    value: T,
    looked: Instant,
}

impl<T> std::fmt::Debug for ChangedFile<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangedFile")
            .field("path", &self.path)
            .field("max_len", &self.max_len)
            .field("recheck", &self.recheck)
            .finish_non_exhaustive()
    }
}

impl<T: Clone> ChangedFile<T> {
    /// `path`, of which at most `max_len` bytes are read; a longer file is an error. Looked at
    /// again at most every [`RECHECK`].
    pub fn new(path: impl Into<PathBuf>, max_len: u64) -> Self {
        Self::with_recheck(path, max_len, RECHECK)
    }

    /// As [`ChangedFile::new`], looked at again at most every `recheck` (zero: at every use).
    pub fn with_recheck(path: impl Into<PathBuf>, max_len: u64, recheck: Duration) -> Self {
        ChangedFile {
            path: path.into(),
            max_len,
            recheck,
            last: Mutex::new(None),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What `load` made of the file's bytes, loaded again only when the file changed since the
    /// last successful load; within `recheck` of the last look, the last load without looking.
    /// A failed `stat`, open or read, or a file longer than the limit, is `io` of the error
    /// (never cached: the next use looks again).
    pub fn get<E>(
        &self,
        load: impl FnOnce(Vec<u8>) -> Result<T, E>,
        io: impl Fn(std::io::Error) -> E,
    ) -> Result<T, E> {
        if let Ok(last) = self.last.lock() {
            if let Some(l) = last.as_ref() {
                if l.looked.elapsed() < self.recheck {
                    return Ok(l.value.clone());
                }
            }
        }
        let looked = Instant::now();
        let stamp = file_stamp(&std::fs::metadata(&self.path).map_err(&io)?);
        if let Ok(mut last) = self.last.lock() {
            if let Some(l) = last.as_mut() {
                if l.stamp == stamp {
                    l.looked = looked;
                    return Ok(l.value.clone());
                }
            }
        }
        // The stamp is taken again from the open file, so a change between the two looks is
        // seen at the next use rather than remembered under the earlier stamp.
        let file = std::fs::File::open(&self.path).map_err(&io)?;
        let stamp = file_stamp(&file.metadata().map_err(&io)?);
        let mut data = Vec::new();
        file.take(self.max_len.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(&io)?;
        if data.len() as u64 > self.max_len {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("is longer than {} bytes", self.max_len),
            )));
        }
        let value = load(data)?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some(Last {
                stamp,
                value: value.clone(),
                looked,
            });
        }
        Ok(value)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_file_is_read_again_only_when_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "one").unwrap();
        let file = ChangedFile::<String>::with_recheck(&path, 16, Duration::ZERO);
        let loads = Cell::new(0);
        let get = || {
            file.get(
                |b| {
                    loads.set(loads.get() + 1);
                    Ok::<_, std::io::Error>(String::from_utf8_lossy(&b).into_owned())
                },
                |e| e,
            )
            .unwrap()
        };
        assert_eq!(get(), "one");
        assert_eq!(get(), "one");
        assert_eq!(loads.get(), 1, "an unchanged file is not loaded again");
        // Rewritten in place (another size, so the change shows whatever the clock's grain).
        std::fs::write(&path, "three").unwrap();
        assert_eq!(get(), "three");
        // Replaced by a rename, same size.
        let next = dir.path().join("next");
        std::fs::write(&next, "four!").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(get(), "four!");
        assert_eq!(loads.get(), 3);
    }

    #[test]
    fn a_missing_or_oversized_file_is_an_error_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let file = ChangedFile::<Vec<u8>>::with_recheck(&path, 4, Duration::ZERO);
        let get = || file.get(Ok::<_, std::io::Error>, |e| e);
        assert_eq!(get().unwrap_err().kind(), std::io::ErrorKind::NotFound);
        std::fs::write(&path, "12345").unwrap();
        let err = get().unwrap_err();
        assert!(err.to_string().contains("longer than 4 bytes"), "{err}");
        std::fs::write(&path, "1234").unwrap();
        assert_eq!(get().unwrap(), b"1234");
        std::fs::remove_file(&path).unwrap();
        assert!(
            get().is_err(),
            "a removed file is not served from the cache"
        );
    }

    #[test]
    fn a_file_is_trusted_for_the_recheck_window_and_looked_at_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "one").unwrap();
        let loads = Cell::new(0);
        let text = |b: Vec<u8>| {
            loads.set(loads.get() + 1);
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&b).into_owned())
        };
        // A window no test run outlasts: the change is not seen, nor the removal.
        let long = ChangedFile::<String>::with_recheck(&path, 16, Duration::from_secs(3600));
        assert_eq!(long.get(text, |e| e).unwrap(), "one");
        std::fs::write(&path, "two!").unwrap();
        assert_eq!(long.get(text, |e| e).unwrap(), "one");
        // A short one: the change is seen once the window has passed.
        let short = ChangedFile::<String>::with_recheck(&path, 16, Duration::from_millis(30));
        assert_eq!(short.get(text, |e| e).unwrap(), "two!");
        std::fs::write(&path, "three").unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(short.get(text, |e| e).unwrap(), "three");
        // A look that finds the file unchanged serves what was loaded, without loading it.
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(short.get(text, |e| e).unwrap(), "three");
        assert_eq!(loads.get(), 3);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(long.get(text, |e| e).unwrap(), "one");
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            short.get(text, |e| e).is_err(),
            "a removed file is an error after the window"
        );
    }
}
