//! Runs the helper as a subprocess: input on stdin, reply on stdout, bounded in time and size.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::error::HelperError;
use crate::types::{HelperInput, HelperReply};

use crate::{DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT};

/// How much of the end of stderr is kept for error messages.
const STDERR_TAIL: usize = 2048;

/// A configured helper command; cheap to share, one subprocess per [`HelperRunner::run`].
#[derive(Debug, Clone)]
pub struct HelperRunner {
    argv: Vec<String>,
    timeout: Duration,
    max_output: usize,
}

impl HelperRunner {
    /// Splits `command` shell-style (no shell is involved) with the default limits.
    pub fn new(command: &str) -> Result<Self, HelperError> {
        let argv = shlex::split(command).ok_or_else(|| HelperError::Parse {
            command: command.to_string(),
            reason: "unbalanced quotes or trailing escape",
        })?;
        if argv.is_empty() {
            return Err(HelperError::Parse {
                command: command.to_string(),
                reason: "empty",
            });
        }
        Ok(HelperRunner {
            argv,
            timeout: DEFAULT_TIMEOUT,
            max_output: DEFAULT_MAX_OUTPUT,
        })
    }

    /// Replaces the time limit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Replaces the output size limit (bytes).
    pub fn with_max_output(mut self, max_output: usize) -> Self {
        self.max_output = max_output;
        self
    }

    /// The program that runs (the first word of the command).
    pub fn program(&self) -> &str {
        self.argv.first().map(String::as_str).unwrap_or_default()
    }

    /// Encodes `input`, runs the helper and decodes its reply.
    pub async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        let bytes = crate::exchange::input_bytes(input)?;
        let out = self.run_raw(&bytes).await?;
        crate::exchange::decode_reply(&out, self.program())
    }

    /// Runs the helper with `input` on stdin and returns its stdout.
    pub async fn run_raw(&self, input: &[u8]) -> Result<Vec<u8>, HelperError> {
        let helper = self.program().to_string();
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout can take down whatever it started too.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| HelperError::Start {
            helper: helper.clone(),
            source,
        })?;
        let pid = child.id();

        let work = self.drive(&mut child, input, &helper);
        let result = match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(HelperError::Timeout {
                helper: helper.clone(),
                timeout: self.timeout,
            }),
        };
        if result.is_err() {
            if let Some(pid) = pid {
                kill_group(pid).await;
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        result
    }

    async fn drive(
        &self,
        child: &mut Child,
        input: &[u8],
        helper: &str,
    ) -> Result<Vec<u8>, HelperError> {
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let write = async move {
            if let Some(mut stdin) = stdin {
                // A helper that ignores its input closes the pipe early; that is not an error.
                let _ = stdin.write_all(input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let read = read_limited(stdout, self.max_output);
        let tail = read_tail(stderr);
        let ((), out, tail) = tokio::join!(write, read, tail);
        let out = match out {
            Ok(Some(out)) => out,
            Ok(None) => {
                return Err(HelperError::OutputTooLarge {
                    helper: helper.to_string(),
                    limit: self.max_output,
                })
            }
            Err(source) => {
                return Err(HelperError::Read {
                    helper: helper.to_string(),
                    source,
                })
            }
        };
        let status = child.wait().await.map_err(|source| HelperError::Read {
            helper: helper.to_string(),
            source,
        })?;
        if !status.success() {
            return Err(HelperError::NonZeroExit {
                helper: helper.to_string(),
                status: status.to_string(),
                stderr_tail: tail,
            });
        }
        if out.is_empty() {
            return Err(HelperError::EmptyOutput {
                helper: helper.to_string(),
            });
        }
        Ok(out)
    }
}

/// Reads everything, or returns `None` as soon as more than `limit` bytes arrived.
async fn read_limited<R: AsyncRead + Unpin>(
    r: Option<R>,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let Some(mut r) = r else {
        return Ok(Some(Vec::new()));
    };
    let mut out = Vec::with_capacity(4096);
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(Some(out));
        }
        if out.len() + n > limit {
            return Ok(None);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Reads stderr to the end, keeping only its last [`STDERR_TAIL`] bytes.
async fn read_tail<R: AsyncRead + Unpin>(r: Option<R>) -> String {
    let Some(mut r) = r else {
        return String::new();
    };
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > STDERR_TAIL {
            let cut = tail.len() - STDERR_TAIL;
            tail.drain(..cut);
        }
    }
    String::from_utf8_lossy(&tail).trim().to_string()
}

/// Kills the helper's whole process group. The `kill` program is used because the workspace
/// forbids `unsafe`, which a direct `kill(2)` call through libc would need.
async fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}
