//! What can go wrong asking a helper, whichever way it is run.

use std::time::Duration;

/// What went wrong running a helper; [`HelperError::kind`] gives a value to match on.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The command line could not be split shell-style, or was empty.
    #[error("cannot parse helper command {command:?}: {reason}")]
    Parse {
        /// The command line as configured.
        command: String,
        /// Why it could not be split.
        reason: &'static str,
    },
    /// The input could not be encoded.
    #[error("could not encode helper input for {identity}: {source}")]
    Encode {
        /// The node being provisioned.
        identity: String,
        /// The encoder's error.
        source: serde_json::Error,
    },
    /// The process could not be started.
    #[error("cannot start {helper}: {source}")]
    Start {
        /// The helper program.
        helper: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Reading the helper's output failed.
    #[error("cannot read {helper} output: {source}")]
    Read {
        /// The helper program.
        helper: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The helper did not finish in time; it and its process group were killed.
    #[error("{helper} did not finish within {timeout:?} and was killed")]
    Timeout {
        /// The helper program.
        helper: String,
        /// The limit that was reached.
        timeout: Duration,
    },
    /// The helper wrote more than the output limit; it was killed.
    #[error("{helper} wrote more than {limit} bytes of output and was killed")]
    OutputTooLarge {
        /// The helper program.
        helper: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// The helper exited unsuccessfully.
    #[error("helper {helper} exited with {status}: {stderr_tail}")]
    NonZeroExit {
        /// The helper program.
        helper: String,
        /// The exit status as text (code or signal).
        status: String,
        /// The last part of what the helper wrote to stderr.
        stderr_tail: String,
    },
    /// The helper exited successfully without writing anything.
    #[error("cannot read {helper} output: zero bytes received")]
    EmptyOutput {
        /// The helper program.
        helper: String,
    },
    /// The output was not a valid reply document.
    #[error("cannot decode output from {helper}: {source}")]
    InvalidJson {
        /// The helper program.
        helper: String,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// A webhook helper could not be set up: its URL, TLS files or secret file are unusable.
    #[error("cannot use webhook {helper}: {reason}")]
    Setup {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// What is wrong.
        reason: String,
    },
    /// No connection to the webhook could be made, so nothing was sent: safe to try again.
    #[error("cannot connect to webhook {helper}: {reason}")]
    Connect {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// Why, from the operating system or TLS.
        reason: String,
    },
    /// The request failed after it may have been sent; it is not retried (the helper may
    /// already have acted on it, say issued a certificate).
    #[error("webhook request to {helper} failed: {reason}")]
    Request {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// Why.
        reason: String,
    },
    /// The webhook answered with a status other than 2xx.
    #[error("webhook {helper} answered HTTP {status}{}", if msg.is_empty() { String::new() } else { format!(": {msg}") })]
    Status {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// The HTTP status code.
        status: u16,
        /// The `msg` of the body when it is a JSON object holding one (bounded, control
        /// characters escaped); empty otherwise.
        msg: String,
    },
    /// The webhook's 2xx reply is not signed as `helper_reply_signature` asks: signed with
    /// another secret, altered in transit, or unsigned where a signature is required. It is
    /// not used.
    #[error("refused the reply of webhook {helper}: {reason}")]
    ReplySignature {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// What is wrong with the signature.
        reason: String,
    },
    /// The webhook did not answer in full within the time limit; the request was abandoned.
    #[error("webhook {helper} did not answer within {timeout:?}")]
    NoAnswer {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// The limit that was reached.
        timeout: Duration,
    },
    /// The webhook's reply was longer than the limit; it was dropped unread past the limit.
    #[error("webhook {helper} replied with more than {limit} bytes; the reply was dropped")]
    ReplyTooLarge {
        /// The webhook URL (without credentials or query).
        helper: String,
        /// The limit in bytes.
        limit: usize,
    },
}

/// A coarse classification of [`HelperError`] for callers and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperErrorKind {
    /// The command line is unusable.
    Parse,
    /// Encoding the input failed.
    Encode,
    /// The program could not be started.
    Start,
    /// Reading from the program failed.
    Read,
    /// The time limit was reached.
    Timeout,
    /// The output limit was reached.
    OutputTooLarge,
    /// The program failed.
    NonZeroExit,
    /// No output.
    EmptyOutput,
    /// Undecodable output.
    InvalidJson,
    /// The webhook's URL, TLS files or secret are unusable.
    Setup,
    /// No connection could be made to the webhook: nothing was sent.
    Connect,
    /// The webhook request failed after it may have been sent.
    Request,
    /// The webhook answered with a status other than 2xx.
    Status,
    /// The webhook's reply is not signed as required, or wrongly signed.
    ReplySignature,
}

impl HelperError {
    /// The kind of failure.
    pub fn kind(&self) -> HelperErrorKind {
        match self {
            HelperError::Parse { .. } => HelperErrorKind::Parse,
            HelperError::Encode { .. } => HelperErrorKind::Encode,
            HelperError::Start { .. } => HelperErrorKind::Start,
            HelperError::Read { .. } => HelperErrorKind::Read,
            HelperError::Timeout { .. } => HelperErrorKind::Timeout,
            HelperError::OutputTooLarge { .. } => HelperErrorKind::OutputTooLarge,
            HelperError::NonZeroExit { .. } => HelperErrorKind::NonZeroExit,
            HelperError::EmptyOutput { .. } => HelperErrorKind::EmptyOutput,
            HelperError::InvalidJson { .. } => HelperErrorKind::InvalidJson,
            HelperError::Setup { .. } => HelperErrorKind::Setup,
            HelperError::Connect { .. } => HelperErrorKind::Connect,
            HelperError::Request { .. } => HelperErrorKind::Request,
            HelperError::Status { .. } => HelperErrorKind::Status,
            HelperError::ReplySignature { .. } => HelperErrorKind::ReplySignature,
            HelperError::NoAnswer { .. } => HelperErrorKind::Timeout,
            HelperError::ReplyTooLarge { .. } => HelperErrorKind::OutputTooLarge,
        }
    }
}
