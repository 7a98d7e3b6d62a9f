//! Free loopback ports, and waiting until something listens on one.

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::{Error, Result};

/// A free TCP port on 127.0.0.1 (bound then released; good enough for tests and local runs).
///
/// # Panics
/// When no loopback port can be bound at all, which leaves nothing to test.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot bind a free loopback port: {e}"))
}

/// Wait until something accepts connections on `127.0.0.1:port`.
pub fn wait_port(port: u16, timeout: Duration) -> Result<()> {
    let listening = || TcpStream::connect(("127.0.0.1", port)).is_ok();
    if crate::wait_until(timeout, Duration::from_millis(25), listening) {
        Ok(())
    } else {
        Err(Error::Failed(format!(
            "nothing listens on 127.0.0.1:{port} after {timeout:?}"
        )))
    }
}
