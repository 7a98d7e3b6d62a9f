//! Exact RPM `[epoch:]version[-release]` parsing and ordering, following rpm's own `rpmvercmp`.
//!
//! This crate answers one question the way rpm (4.15 and later) answers it: is this package
//! version older, newer or the same as that one? It has no required dependencies, uses no
//! unsafe code and never allocates while comparing.
//!
//! # Quick start
//!
//! ```
//! use rpm_evr::Version;
//!
//! let installed: Version = "1:2.4.1-3.el9".parse()?;
//! let target = Version::parse("1:2.4.10-1.el9")?;
//! assert!(installed < target);
//!
//! // Leading zeros do not matter, so these are the same version (and hash the same).
//! assert_eq!(Version::parse("1.0")?, Version::parse("1.00")?);
//!
//! // A missing epoch is epoch 0.
//! assert_eq!(Version::parse("0:1.0-1")?, Version::parse("1.0-1")?);
//!
//! // Display gives back exactly what was parsed.
//! assert_eq!(target.to_string(), "1:2.4.10-1.el9");
//! # Ok::<(), rpm_evr::ParseError>(())
//! ```
//!
//! To compare two EVR strings once, without keeping them, [`compare_evr`] does it without
//! allocating. Bare version or release strings, with no epoch and no release, are compared with
//! [`rpmvercmp`], which accepts any string just like its C namesake:
//!
//! ```
//! use std::cmp::Ordering;
//! use rpm_evr::rpmvercmp;
//!
//! assert_eq!(rpmvercmp("1.0~rc1", "1.0"), Ordering::Less); // pre-release
//! assert_eq!(rpmvercmp("1.0^git1", "1.0"), Ordering::Greater); // post-release snapshot
//! assert_eq!(rpmvercmp("1.0^git1", "1.0.1"), Ordering::Less);
//! assert_eq!(rpmvercmp("2.0", "2_0"), Ordering::Equal); // separators are not compared
//! ```
//!
//! # The ordering
//!
//! Epochs are compared first (a missing epoch is 0), then versions, then releases, each
//! version and release with rpm's `rpmvercmp` algorithm:
//!
//! * The string is cut into segments: maximal runs of ASCII digits, maximal runs of ASCII
//!   letters, and the single characters `~` and `^`. Every other character is a separator; only
//!   the segments are compared, so `1.0`, `1_0` and `1+0` are equal.
//! * Segments are compared pairwise from the left. Numeric segments compare as numbers of any
//!   length (leading zeros are ignored, so `1.01` equals `1.1`); letter segments compare
//!   byte-wise (`A` < `Z` < `a`); a numeric segment is newer than a letter segment.
//! * `~` sorts before everything, even the end of the string: `1.0~rc1` < `1.0`.
//! * `^` sorts after the end of the string but before any other segment:
//!   `1.0` < `1.0^git1` < `1.0.1`.
//! * When one string runs out of segments first, the longer one is newer (`1.0` < `1.0.1`,
//!   `1.0` < `1.0a`).
//! * A missing release is older than any release: `1.0` < `1.0-1`. This is what rpm's
//!   `rpmverCmp` does. (rpm's *dependency matching* treats a missing release as "any release",
//!   which is a question about ranges, not an order; it is out of scope here.)
//!
//! [`PartialEq`], [`Eq`] and [`Hash`] agree with this order: two versions are equal exactly
//! when they compare equal, and then they hash the same. Equal versions may still [`Display`]
//! differently, because the original text is kept.
//!
//! [`Display`]: std::fmt::Display
//!
//! # What the parser rejects
//!
//! [`Version::parse`] accepts what rpm accepts in a package's `Epoch`, `Version` and `Release`
//! tags and in a versioned dependency, and rejects with a [`ParseError`] (whose
//! [`ParseErrorKind`] callers can match) what rpm rejects there:
//!
//! * the empty string, an empty version (`1:`, `-1`) or an empty release (`1.0-`);
//! * any character other than ASCII letters and digits, `.`, `_`, `+`, `%`, `{`, `}`, `~`, `^`
//!   and the separators `:` and `-` (so no whitespace, no `/`, no non-ASCII text);
//! * the sequence `..`;
//! * more than one `:` or more than one `-`;
//! * an epoch that is not an unsigned decimal number fitting in 32 bits (rpm stores epochs as
//!   `uint32`).
//!
//! An empty epoch (`:1.0`) is accepted as epoch 0, as rpm does. `%`, `{` and `}` are accepted
//! because rpm accepts them (it warns about a possible unexpanded macro); they are separators
//! when comparing.
//!
//! # Where the Go port differs
//!
//! The Go provisioner vendors a port of the comparison (`host/version.go`, from
//! `go-rpm-version`). It differs from rpm in these ways; this crate follows rpm in every case:
//!
//! * **No caret.** `^` is an ordinary separator there, so `1.0^` equals `1.0` (rpm: newer),
//!   `1.0^20160101` is newer than `1.0.1` (rpm: older) and `1.0^1` is newer than `1.0a` (rpm:
//!   older, because `^` sorts before any segment).
//! * **Release split at the first `-`.** `1.0-2-3` is version `1.0`, release `2-3` there; rpm
//!   splits at the last `-`, and both rpm's spec checks and this crate reject a second `-`.
//! * **Lenient epochs.** An epoch that is not a number (`a:1.0`), or is too large for an `int`,
//!   silently becomes 0, and leading whitespace is trimmed. rpm rejects `a:1.0`; so does this
//!   crate.
//! * **A release without segments equals no release.** `1.0-` and `1.0-.` equal `1.0` there;
//!   rpm treats such a release as present, hence newer. This crate rejects the empty release and
//!   orders `1.0-.` after `1.0`, as rpm does.
//! * **No errors at all.** Any input parses, so typos compare silently; here they are a
//!   [`ParseError`].
//!
//! Run through this crate's conformance tables (5683 comparisons answered by rpm 4.18), the Go
//! port disagrees with rpm on 192 of them, all from the first and fourth points above.
//!
//! # Features
//!
//! * `serde`: [`Version`] serializes as its string form and deserializes through
//!   [`Version::parse`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

#[cfg(feature = "serde")]
mod serde_impl;

/// Compares two bare version (or release) strings exactly as rpm's `rpmvercmp` does.
///
/// Any string is accepted, as in C: characters that are neither ASCII letters, digits, `~`
/// nor `^` separate segments, and a NUL character ends the string, as it would in C. No
/// allocation takes place.
///
/// ```
/// use std::cmp::Ordering;
/// use rpm_evr::rpmvercmp;
///
/// assert_eq!(rpmvercmp("5.5p1", "5.5p10"), Ordering::Less);
/// assert_eq!(rpmvercmp("10.0001", "10.1"), Ordering::Equal);
/// assert_eq!(rpmvercmp("6.0.rc1", "6.0"), Ordering::Greater);
/// ```
pub fn rpmvercmp(a: &str, b: &str) -> Ordering {
    cmp_segments(a.as_bytes(), b.as_bytes())
}

/// Whether `c` is skipped between segments. NUL is not: it ends the string, as in C.
#[inline]
fn is_separator(c: u8) -> bool {
    !(c.is_ascii_alphanumeric() || c == b'~' || c == b'^' || c == 0)
}

/// The byte at `i`, or NUL past the end, so the loop below reads like rpm's C loop over a
/// NUL-terminated string and behaves identically on embedded NULs.
#[inline]
fn at(s: &[u8], i: usize) -> u8 {
    match s.get(i) {
        Some(&c) => c,
        None => 0,
    }
}

/// Advances `i` over bytes of `s` matching `pred`.
#[inline]
fn skip_while(s: &[u8], mut i: usize, pred: impl Fn(u8) -> bool) -> usize {
    while i < s.len() && pred(s[i]) {
        i += 1;
    }
    i
}

/// The comparison loop of rpm's `rpmvercmp`, over bytes.
fn cmp_segments(a: &[u8], b: &[u8]) -> Ordering {
    // Identical strings are equal whatever they contain; this is also rpm's fast path.
    if a == b {
        return Ordering::Equal;
    }
    cmp_segments_from(a, b, 0)
}

/// [`cmp_segments`] for strings without NUL (checked versions and releases), skipping their
/// common prefix first: most versions compared in practice share one.
fn cmp_checked_segments(a: &[u8], b: &[u8]) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let mut start = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    // Back up to just after a separator, `~` or `^`: there both strings start a fresh segment
    // in the same state, because everything before was identical. A NUL in the prefix would end
    // both strings in C, which is why this is only for checked input.
    while start > 0 && a.get(start - 1).is_some_and(u8::is_ascii_alphanumeric) {
        start -= 1;
    }
    cmp_segments_from(a, b, start)
}

/// The loop of `rpmvercmp`, from byte `start` of both strings.
fn cmp_segments_from(a: &[u8], b: &[u8], start: usize) -> Ordering {
    let (mut i, mut j) = (start, start);
    loop {
        i = skip_while(a, i, is_separator);
        j = skip_while(b, j, is_separator);
        let (x, y) = (at(a, i), at(b, j));

        // A tilde sorts before anything, the end of the string included.
        if x == b'~' || y == b'~' {
            if x != b'~' {
                return Ordering::Greater;
            }
            if y != b'~' {
                return Ordering::Less;
            }
            i += 1;
            j += 1;
            continue;
        }

        // A caret sorts after the end of the string but before any other segment.
        if x == b'^' || y == b'^' {
            if x == 0 {
                return Ordering::Less;
            }
            if y == 0 {
                return Ordering::Greater;
            }
            if x != b'^' {
                return Ordering::Greater;
            }
            if y != b'^' {
                return Ordering::Less;
            }
            i += 1;
            j += 1;
            continue;
        }

        if x == 0 || y == 0 {
            break;
        }

        if x.is_ascii_digit() {
            // A number is newer than letters.
            if !y.is_ascii_digit() {
                return Ordering::Greater;
            }
            // Numbers of any length: drop leading zeros, then the longer is larger, and
            // equal lengths compare as text.
            let si = skip_while(a, i, |c| c == b'0');
            let sj = skip_while(b, j, |c| c == b'0');
            i = skip_while(a, si, |c| c.is_ascii_digit());
            j = skip_while(b, sj, |c| c.is_ascii_digit());
            let ord = (i - si)
                .cmp(&(j - sj))
                .then_with(|| a[si..i].cmp(&b[sj..j]));
            if ord != Ordering::Equal {
                return ord;
            }
        } else {
            if !y.is_ascii_alphabetic() {
                return Ordering::Less;
            }
            let (si, sj) = (i, j);
            i = skip_while(a, si, |c| c.is_ascii_alphabetic());
            j = skip_while(b, sj, |c| c.is_ascii_alphabetic());
            let ord = a[si..i].cmp(&b[sj..j]);
            if ord != Ordering::Equal {
                return ord;
            }
        }
    }
    // All segments matched; whichever string still has a segment left is newer.
    match (at(a, i), at(b, j)) {
        (0, 0) => Ordering::Equal,
        (0, _) => Ordering::Less,
        _ => Ordering::Greater,
    }
}

/// Feeds the segments of `s` to `state`, so that strings which [`rpmvercmp`] finds equal hash
/// the same: separators are skipped and numbers lose their leading zeros.
fn hash_segments<H: Hasher>(s: &[u8], state: &mut H) {
    // Tags keep segment boundaries apart: "ab" must not hash like "a" followed by "b".
    const TILDE: u8 = 1;
    const CARET: u8 = 2;
    const ALPHA: u8 = 3;
    const NUMBER: u8 = 4;
    const END: u8 = 5;
    let mut i = 0;
    loop {
        i = skip_while(s, i, is_separator);
        match at(s, i) {
            0 => break,
            b'~' => {
                state.write_u8(TILDE);
                i += 1;
            }
            b'^' => {
                state.write_u8(CARET);
                i += 1;
            }
            c if c.is_ascii_digit() => {
                let start = skip_while(s, i, |c| c == b'0');
                i = skip_while(s, start, |c| c.is_ascii_digit());
                state.write_u8(NUMBER);
                state.write_usize(i - start);
                state.write(&s[start..i]);
            }
            _ => {
                let start = i;
                i = skip_while(s, start, |c| c.is_ascii_alphabetic());
                state.write_u8(ALPHA);
                state.write_usize(i - start);
                state.write(&s[start..i]);
            }
        }
    }
    state.write_u8(END);
}

/// An RPM `[epoch:]version[-release]`, ordered exactly as rpm orders it.
///
/// Parse one with [`Version::parse`], [`str::parse`] or [`TryFrom`], or build one from its
/// parts with [`Version::new`]. The original text is kept, and [`Display`](fmt::Display)
/// writes it back unchanged.
///
/// Ordering, equality and hashing follow rpm (see the [crate documentation](crate)), so
/// `1.0` and `1.00` are equal, as are `0:1.0` and `1.0`.
///
/// ```
/// use rpm_evr::Version;
///
/// let v = Version::parse("2:1.4.0~rc2-1.fc40")?;
/// assert_eq!(v.epoch(), 2);
/// assert_eq!(v.version(), "1.4.0~rc2");
/// assert_eq!(v.release(), Some("1.fc40"));
/// assert!(v < Version::parse("2:1.4.0-1.fc40")?);
/// # Ok::<(), rpm_evr::ParseError>(())
/// ```
#[derive(Clone)]
pub struct Version {
    /// The text as given (or as assembled by [`Version::new`]).
    text: Box<str>,
    /// The epoch, 0 when none was written.
    epoch: u32,
    /// Whether the text carries an epoch (possibly an empty one, `:1.0`).
    explicit_epoch: bool,
    /// Byte offset where the version starts (after the `:`).
    version_start: usize,
    /// Byte offset where the version ends; a release follows after a `-` if this is not the
    /// end of the text.
    version_end: usize,
}

impl Version {
    /// Parses `[epoch:]version[-release]`.
    ///
    /// Fails on the inputs rpm rejects; see the [crate documentation](crate#what-the-parser-rejects).
    ///
    /// ```
    /// use rpm_evr::{ParseErrorKind, Version};
    ///
    /// assert!(Version::parse("3.2.1-4.el8").is_ok());
    /// let err = Version::parse("1.0 beta").unwrap_err();
    /// assert_eq!(err.kind(), &ParseErrorKind::InvalidChar { ch: ' ', offset: 3 });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid rpm version \"1.0 beta\": invalid character ' ' at byte 3"
    /// );
    /// ```
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        let layout = Layout::of(s).map_err(|kind| ParseError::new(kind, s))?;
        Ok(layout.build(s.into()))
    }

    /// Builds a version from its parts, as rpm's `Epoch`, `Version` and `Release` tags hold
    /// them. `epoch` of `None` means no epoch is written (which compares as 0).
    ///
    /// `version` and `release` are checked as [`Version::parse`] checks them, so neither may
    /// contain `:` or `-`, nor be empty.
    ///
    /// ```
    /// use rpm_evr::Version;
    ///
    /// let v = Version::new(Some(1), "2.0", Some("3"))?;
    /// assert_eq!(v.to_string(), "1:2.0-3");
    /// assert_eq!(v, "1:2.0-3".parse()?);
    /// assert!(Version::new(None, "2.0-3", None).is_err());
    /// # Ok::<(), rpm_evr::ParseError>(())
    /// ```
    pub fn new(
        epoch: Option<u32>,
        version: &str,
        release: Option<&str>,
    ) -> Result<Self, ParseError> {
        check_field(version, Field::Version)?;
        if let Some(release) = release {
            check_field(release, Field::Release)?;
        }
        let mut text =
            String::with_capacity(11 + version.len() + release.map_or(0, |r| r.len() + 1));
        if let Some(epoch) = epoch {
            text.push_str(&epoch.to_string());
            text.push(':');
        }
        let version_start = text.len();
        text.push_str(version);
        let version_end = text.len();
        if let Some(release) = release {
            text.push('-');
            text.push_str(release);
        }
        Ok(Version {
            text: text.into_boxed_str(),
            epoch: epoch.unwrap_or(0),
            explicit_epoch: epoch.is_some(),
            version_start,
            version_end,
        })
    }

    /// The epoch; 0 when none was written.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Whether the text carries an epoch (`0:1.0` does, `1.0` does not). It does not affect
    /// ordering or equality.
    pub fn has_explicit_epoch(&self) -> bool {
        self.explicit_epoch
    }

    /// The version part, between the epoch and the release.
    pub fn version(&self) -> &str {
        self.text
            .get(self.version_start..self.version_end)
            .unwrap_or_default()
    }

    /// The release part, after the `-`, if there is one.
    pub fn release(&self) -> Option<&str> {
        self.text.get(self.version_end + 1..)
    }

    /// The whole text, as parsed.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Where the parts of a checked EVR string lie.
struct Layout {
    epoch: Option<u32>,
    version_start: usize,
    version_end: usize,
}

impl Layout {
    /// Checks `s` and finds its parts, or says what rpm would object to.
    fn of(s: &str) -> Result<Layout, ParseErrorKind> {
        if s.is_empty() {
            return Err(ParseErrorKind::Empty);
        }
        let bytes = s.as_bytes();
        let mut colon = None;
        let mut dash = None;
        for (offset, &c) in bytes.iter().enumerate() {
            // One table lookup per byte, and a single well-predicted branch for the common case,
            // keep validation cheap next to the comparison itself.
            let class = CLASS[usize::from(c)];
            if class == ALLOWED {
                continue;
            }
            match class {
                DOT if bytes.get(offset + 1) == Some(&b'.') => {
                    return Err(ParseErrorKind::DoubleDot { offset });
                }
                DOT => {}
                COLON if colon.is_some() => return Err(ParseErrorKind::MultipleColons),
                COLON => colon = Some(offset),
                DASH if dash.is_some() => return Err(ParseErrorKind::MultipleHyphens),
                DASH => dash = Some(offset),
                _ => return Err(invalid_char(s, offset)),
            }
        }
        let (epoch, version_start) = match colon {
            None => (None, 0),
            Some(colon) => {
                let digits = &s[..colon];
                if !digits.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(ParseErrorKind::InvalidEpoch);
                }
                let epoch = if digits.is_empty() {
                    0
                } else {
                    digits
                        .parse::<u32>()
                        .map_err(|_| ParseErrorKind::EpochOverflow)?
                };
                (Some(epoch), colon + 1)
            }
        };
        let version_end = dash.unwrap_or(s.len());
        // The epoch check above guarantees the colon comes before any hyphen.
        if version_end <= version_start {
            return Err(ParseErrorKind::EmptyVersion);
        }
        if dash.is_some_and(|d| d + 1 == s.len()) {
            return Err(ParseErrorKind::EmptyRelease);
        }
        Ok(Layout {
            epoch,
            version_start,
            version_end,
        })
    }

    /// The epoch, version and release of `s`, which this layout was made from.
    fn parts(self, s: &str) -> (u32, &str, Option<&str>) {
        (
            self.epoch.unwrap_or(0),
            s.get(self.version_start..self.version_end)
                .unwrap_or_default(),
            s.get(self.version_end + 1..),
        )
    }

    fn build(self, text: Box<str>) -> Version {
        Version {
            text,
            epoch: self.epoch.unwrap_or(0),
            explicit_epoch: self.epoch.is_some(),
            version_start: self.version_start,
            version_end: self.version_end,
        }
    }
}

/// Byte classes for [`Layout::of`].
const INVALID: u8 = 0;
const ALLOWED: u8 = 1;
const DOT: u8 = 2;
const COLON: u8 = 3;
const DASH: u8 = 4;

/// The class of every byte: what rpm allows in a version or release, and the separators.
static CLASS: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if is_allowed(b) {
            table[c] = ALLOWED;
        }
        c += 1;
    }
    table[b'.' as usize] = DOT;
    table[b':' as usize] = COLON;
    table[b'-' as usize] = DASH;
    table
};

/// Characters rpm allows in a version or release, besides the `:` and `-` that separate them.
#[inline]
const fn is_allowed(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'+' | b'%' | b'{' | b'}' | b'~' | b'^')
}

fn invalid_char(s: &str, offset: usize) -> ParseErrorKind {
    let ch = s
        .get(offset..)
        .and_then(|rest| rest.chars().next())
        .unwrap_or('\u{FFFD}');
    ParseErrorKind::InvalidChar { ch, offset }
}

/// Which part [`Version::new`] is checking.
#[derive(Clone, Copy)]
enum Field {
    Version,
    Release,
}

fn check_field(s: &str, field: Field) -> Result<(), ParseError> {
    let fail = |kind| Err(ParseError::new(kind, s));
    if s.is_empty() {
        return fail(match field {
            Field::Version => ParseErrorKind::EmptyVersion,
            Field::Release => ParseErrorKind::EmptyRelease,
        });
    }
    let bytes = s.as_bytes();
    for (offset, &c) in bytes.iter().enumerate() {
        if c == b'.' && offset > 0 && bytes[offset - 1] == b'.' {
            return fail(ParseErrorKind::DoubleDot { offset: offset - 1 });
        }
        if !is_allowed(c) {
            return fail(invalid_char(s, offset));
        }
    }
    Ok(())
}

/// rpm's `rpmverCmp` over the parts of two EVRs.
fn cmp_parts(a: (u32, &str, Option<&str>), b: (u32, &str, Option<&str>)) -> Ordering {
    a.0.cmp(&b.0)
        .then_with(|| cmp_checked_segments(a.1.as_bytes(), b.1.as_bytes()))
        .then_with(|| match (a.2, b.2) {
            (Some(x), Some(y)) => cmp_checked_segments(x.as_bytes(), y.as_bytes()),
            // A release that is present is newer than none at all, as in rpm's rpmverCmp.
            (x, y) => x.is_some().cmp(&y.is_some()),
        })
}

/// Compares two `[epoch:]version[-release]` strings the way [`Version`] would, without
/// allocating (unless one is invalid, when the error holds a copy of it).
///
/// Use it to compare strings once; parse into [`Version`] to compare the same value many times.
///
/// ```
/// use std::cmp::Ordering;
/// use rpm_evr::compare_evr;
///
/// assert_eq!(compare_evr("1:1.0-1", "2.0-1")?, Ordering::Greater);
/// assert_eq!(compare_evr("1.0-1", "0:1.00-01")?, Ordering::Equal);
/// assert!(compare_evr("1.0", "1..0").is_err());
/// # Ok::<(), rpm_evr::ParseError>(())
/// ```
pub fn compare_evr(a: &str, b: &str) -> Result<Ordering, ParseError> {
    let la = Layout::of(a).map_err(|kind| ParseError::new(kind, a))?;
    let lb = Layout::of(b).map_err(|kind| ParseError::new(kind, b))?;
    Ok(cmp_parts(la.parts(a), lb.parts(b)))
}

impl Version {
    fn parts(&self) -> (u32, &str, Option<&str>) {
        (self.epoch, self.version(), self.release())
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_parts(self.parts(), other.parts())
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl Hash for Version {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.epoch);
        hash_segments(self.version().as_bytes(), state);
        match self.release() {
            None => state.write_u8(0),
            Some(release) => {
                state.write_u8(1);
                hash_segments(release.as_bytes(), state);
            }
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Version").field(&&*self.text).finish()
    }
}

impl FromStr for Version {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s)
    }
}

impl TryFrom<&str> for Version {
    type Error = ParseError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Version::parse(s)
    }
}

impl TryFrom<String> for Version {
    type Error = ParseError;

    /// Parses `s`, reusing its buffer.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        match Layout::of(&s) {
            Ok(layout) => Ok(layout.build(s.into_boxed_str())),
            Err(kind) => Err(ParseError::new(kind, &s)),
        }
    }
}

impl AsRef<str> for Version {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

/// Why a string is not a valid RPM version.
///
/// The message names the input and the problem, for example
/// `invalid rpm version "1.0..2": ".." at byte 3`. Match on [`ParseError::kind`] to tell the
/// problems apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    kind: ParseErrorKind,
    input: Box<str>,
}

impl ParseError {
    fn new(kind: ParseErrorKind, input: &str) -> Self {
        ParseError {
            kind,
            input: input.into(),
        }
    }

    /// What is wrong.
    pub fn kind(&self) -> &ParseErrorKind {
        &self.kind
    }

    /// The text that failed to parse (for [`Version::new`], the offending part).
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid rpm version {:?}: {}", self.input, self.kind)
    }
}

impl std::error::Error for ParseError {}

/// The kinds of [`ParseError`], one per rule rpm enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The input is empty.
    Empty,
    /// A character rpm does not allow in versions: anything but ASCII letters and digits and
    /// `._+%{}~^` (plus `:` and `-` as separators).
    InvalidChar {
        /// The character.
        ch: char,
        /// Its byte offset in the input.
        offset: usize,
    },
    /// The sequence `..`, which rpm forbids.
    DoubleDot {
        /// Byte offset of the first dot.
        offset: usize,
    },
    /// More than one `:`.
    MultipleColons,
    /// More than one `-` (rpm splits the release at the last one and its spec checks reject a
    /// second).
    MultipleHyphens,
    /// Something other than decimal digits before the `:`.
    InvalidEpoch,
    /// An epoch larger than `u32::MAX`.
    EpochOverflow,
    /// No version between the epoch and the release.
    EmptyVersion,
    /// Nothing after the `-`.
    EmptyRelease,
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseErrorKind::Empty => f.write_str("empty string"),
            ParseErrorKind::InvalidChar { ch, offset } => {
                write!(f, "invalid character {ch:?} at byte {offset}")
            }
            ParseErrorKind::DoubleDot { offset } => write!(f, "\"..\" at byte {offset}"),
            ParseErrorKind::MultipleColons => f.write_str("more than one ':'"),
            ParseErrorKind::MultipleHyphens => f.write_str("more than one '-'"),
            ParseErrorKind::InvalidEpoch => f.write_str("epoch is not an unsigned integer"),
            ParseErrorKind::EpochOverflow => f.write_str("epoch does not fit in 32 bits"),
            ParseErrorKind::EmptyVersion => f.write_str("empty version"),
            ParseErrorKind::EmptyRelease => f.write_str("empty release after '-'"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_split_like_rpm() {
        let v = Version::parse("12:1.2.3~rc1^git2-4.el9_1").unwrap();
        assert_eq!(
            (v.epoch(), v.version(), v.release()),
            (12, "1.2.3~rc1^git2", Some("4.el9_1"))
        );
        assert!(v.has_explicit_epoch());
        let v = Version::parse("1.0").unwrap();
        assert_eq!((v.epoch(), v.version(), v.release()), (0, "1.0", None));
        assert!(!v.has_explicit_epoch());
        let v = Version::parse(":1.0").unwrap();
        assert_eq!(
            (v.epoch(), v.version(), v.has_explicit_epoch()),
            (0, "1.0", true)
        );
    }

    #[test]
    fn nul_ends_the_string_like_c() {
        assert_eq!(rpmvercmp("1.0\0zzz", "1.0"), Ordering::Equal);
        assert_eq!(rpmvercmp("1.0\0", "1.0.1"), Ordering::Less);
    }
}
