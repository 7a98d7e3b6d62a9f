//! What a step of the tooling (packaging, a benchmark) fails with: a sentence naming the step
//! and why, an I/O error, or the harness's own error (a broker, a process or a certificate it
//! could not make). Every error ends up printed to the person running `cargo xtask`, so a
//! failure is one message with its cause appended ([`Context`]), and [`crate::bail!`] returns one.

use std::fmt::Display;

/// A tooling step's failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step failed; the text says which and why.
    #[error("{0}")]
    Failed(String),
    /// A file or process operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The harness could not start or make what the step needs.
    #[error(transparent)]
    Harness(#[from] crate::Error),
}

/// The result of a tooling step.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns a [`step::Error::Failed`](crate::step::Error::Failed) with the formatted message.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::step::Error::Failed(format!($($arg)*)))
    };
}

/// What was being done, put before an error's own message (or made the error, for an
/// `Option` that is empty).
pub trait Context<T> {
    /// The error, prefixed with `what`.
    fn context(self, what: impl Display) -> Result<T>;
    /// As [`Context::context`], the text made only on failure.
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Display) -> Result<T> {
        self.map_err(|e| Error::Failed(format!("{what}: {e}")))
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| Error::Failed(format!("{}: {e}", what())))
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Display) -> Result<T> {
        self.ok_or_else(|| Error::Failed(what.to_string()))
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.ok_or_else(|| Error::Failed(what().to_string()))
    }
}
