//! Side-by-side comparison of rpm-evr with the other RPM version crates.
