//! What a packaging step fails with: a sentence naming the step and why, an I/O error, or the
//! test harness's error (a broker, a process or a certificate it could not make). Every error
//! ends up printed to the person running `cargo xtask dist`, so a failure is one message with
//! its cause appended ([`Context`]), and [`bail!`] returns one.

use std::fmt::Display;

/// A packaging step's failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step failed; the text says which and why.
    #[error("{0}")]
    Failed(String),
    /// A file or process operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The test harness could not start or make what a verification needs.
    #[error(transparent)]
    Harness(#[from] test_support::Error),
}

/// The result of the packaging steps.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns an [`Error::Failed`] with the formatted message.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Failed(format!($($arg)*)))
    };
}
pub(crate) use bail;

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
