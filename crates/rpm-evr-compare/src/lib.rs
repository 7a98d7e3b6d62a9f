//! Side-by-side comparison of rpm-evr with the other RPM version crates.
//!
//! The same case tables (answered by a real rpm, kept in `crates/rpm-evr/testdata`) and the
//! same benchmark inputs go through rpm-evr, the `rpm-version` crate and the `rpm` crate's `Evr`.
//! This crate is never published; it exists so the claims in rpm-evr's README can be re-run.

#![deny(missing_docs)]
use std::cmp::Ordering;
use std::path::PathBuf;

/// One comparison whose answer rpm gave.
#[derive(Clone, Debug)]
pub struct Case {
    /// Which table it comes from (`vercmp.tsv` or `evr.tsv`).
    pub table: &'static str,
    /// Line number in that table.
    pub line: usize,
    /// Left-hand input.
    pub a: String,
    /// Right-hand input.
    pub b: String,
    /// rpm's answer.
    pub expected: Ordering,
}

/// The implementations under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// This workspace's crate.
    RpmEvr,
    /// `rpm-version` 0.5.1.
    RpmVersion,
    /// `rpm` 0.23.4's `Evr`, the last with its own implementation.
    RpmCrate,
}

impl Impl {
    /// All of them, ours first.
    pub const ALL: [Impl; 3] = [Impl::RpmEvr, Impl::RpmVersion, Impl::RpmCrate];

    /// The crate name and version, as printed in tables.
    pub fn name(self) -> &'static str {
        match self {
            Impl::RpmEvr => "rpm-evr 0.1.0",
            Impl::RpmVersion => "rpm-version 0.5.1",
            Impl::RpmCrate => "rpm 0.23.4 (Evr)",
        }
    }

    /// Compares one case's inputs. Bare strings (the `vercmp.tsv` table) go through rpm-evr's
    /// `rpmvercmp`; EVR strings through `Version`. The peers parse every input as an EVR, which
    /// is what rpm did to answer both tables. `None` means the implementation rejected an input.
    pub fn compare(self, case: &Case) -> Option<Ordering> {
        match self {
            Impl::RpmEvr if case.table == "vercmp.tsv" => {
                Some(rpm_evr::rpmvercmp(&case.a, &case.b))
            }
            Impl::RpmEvr => {
                let a = rpm_evr::Version::parse(&case.a).ok()?;
                let b = rpm_evr::Version::parse(&case.b).ok()?;
                Some(a.cmp(&b))
            }
            Impl::RpmVersion => {
                Some(rpm_version::Evr::parse(&case.a).cmp(&rpm_version::Evr::parse(&case.b)))
            }
            Impl::RpmCrate => Some(rpm::Evr::parse(&case.a).cmp(&rpm::Evr::parse(&case.b))),
        }
    }

    /// Whether `==` agrees with `cmp` on this case (the contract of `Eq` and `Ord`).
    pub fn eq_agrees_with_cmp(self, case: &Case) -> bool {
        match self {
            Impl::RpmEvr if case.table == "vercmp.tsv" => true,
            Impl::RpmEvr => match (
                rpm_evr::Version::parse(&case.a),
                rpm_evr::Version::parse(&case.b),
            ) {
                (Ok(a), Ok(b)) => (a == b) == (a.cmp(&b) == Ordering::Equal),
                _ => true,
            },
            Impl::RpmVersion => {
                let (a, b) = (
                    rpm_version::Evr::parse(&case.a),
                    rpm_version::Evr::parse(&case.b),
                );
                (a == b) == (a.cmp(&b) == Ordering::Equal)
            }
            Impl::RpmCrate => {
                let (a, b) = (rpm::Evr::parse(&case.a), rpm::Evr::parse(&case.b));
                (a == b) == (a.cmp(&b) == Ordering::Equal)
            }
        }
    }
}

/// Why the case tables could not be read.
#[derive(Debug)]
pub struct LoadError(pub String);

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// Reads both case tables from `crates/rpm-evr/testdata`.
pub fn load_cases() -> Result<Vec<Case>, LoadError> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rpm-evr/testdata");
    let mut cases = Vec::new();
    for table in ["vercmp.tsv", "evr.tsv"] {
        let path = dir.join(table);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| LoadError(format!("read case table {}: {e}", path.display())))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.starts_with('#'))
        {
            let bad = || LoadError(format!("{}:{}: malformed case line", path.display(), n + 1));
            let mut fields = line.split('\t');
            let (a, b, e) = match (fields.next(), fields.next(), fields.next()) {
                (Some(a), Some(b), Some(e)) => (a, b, e),
                _ => return Err(bad()),
            };
            let expected = match e {
                "-1" => Ordering::Less,
                "0" => Ordering::Equal,
                "1" => Ordering::Greater,
                _ => return Err(bad()),
            };
            cases.push(Case {
                table,
                line: n + 1,
                a: a.to_owned(),
                b: b.to_owned(),
                expected,
            });
        }
    }
    Ok(cases)
}

/// [`BENCH_PAIRS`] parsed once by each implementation, for the "compare parsed" measurements.
pub struct ParsedPairs {
    /// rpm-evr's.
    pub ours: Vec<(rpm_evr::Version, rpm_evr::Version)>,
    /// rpm-version's.
    pub rpm_version: Vec<(rpm_version::Evr<'static>, rpm_version::Evr<'static>)>,
    /// The rpm crate's.
    pub rpm_crate: Vec<(rpm::Evr<'static>, rpm::Evr<'static>)>,
}

impl ParsedPairs {
    /// Parses every pair; the pairs are fixed valid versions.
    #[allow(clippy::unwrap_used)]
    pub fn new() -> Self {
        ParsedPairs {
            ours: BENCH_PAIRS
                .iter()
                .map(|(a, b)| {
                    (
                        rpm_evr::Version::parse(a).unwrap(),
                        rpm_evr::Version::parse(b).unwrap(),
                    )
                })
                .collect(),
            rpm_version: BENCH_PAIRS
                .iter()
                .map(|(a, b)| (rpm_version::Evr::parse(a), rpm_version::Evr::parse(b)))
                .collect(),
            rpm_crate: BENCH_PAIRS
                .iter()
                .map(|(a, b)| (rpm::Evr::parse(a), rpm::Evr::parse(b)))
                .collect(),
        }
    }
}

impl Default for ParsedPairs {
    fn default() -> Self {
        Self::new()
    }
}

/// Realistic EVR pairs used by the benchmark: what a fleet reports, with the usual near misses.
pub const BENCH_PAIRS: &[(&str, &str)] = &[
    ("1:2.4.1-3.el9", "1:2.4.10-1.el9"),
    ("0.27.0-1.el8", "0.27.0-1.el8"),
    ("5.14.0-362.24.1.el9_3", "5.14.0-362.18.1.el9_3"),
    ("1.0~rc1-1", "1.0-1"),
    ("2.0^20240101git1a2b3c-1.fc40", "2.0-1.fc40"),
    ("10.0001-1", "10.1-1"),
    ("3.2.1-4.el8", "3.2.1-4.el9"),
    ("1:1.1.1k-12.el8_9", "1:1.1.1k-9.el8_7"),
];
