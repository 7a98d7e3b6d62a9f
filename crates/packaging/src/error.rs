//! What a packaging step fails with: the tooling's step error, shared with the benchmark.

pub(crate) use test_support::bail;
pub use test_support::step::{Context, Error, Result};
