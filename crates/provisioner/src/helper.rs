//! The cycle's [`Helper`]: the site helper run as a child process with the node's data on stdin
//! (helper-protocol's [`HelperRunner`], with its time and output limits), or, when `helper` is an
//! `http://` or `https://` URL, a webhook the same bytes are POSTed to
//! ([`helper_protocol::WebhookClient`]). Either way the input is encoded by
//! [`helper_protocol::input_bytes`] and the reply decoded by [`helper_protocol::decode_reply`].

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use helper_protocol::webhook::is_webhook;
use helper_protocol::{HelperErrorKind, HelperRunner, WebhookClient, WebhookOptions};
use provision_core::helper_protocol::{HelperError, HelperInput, HelperReply};
use provision_core::{Backoff, Helper, SystemRandom};

use crate::config::Config;
use tracing::warn;

/// How many times a webhook request is tried when no connection can be made (nothing was
/// sent): as often as the RPCs of three tries, with the same backoff between tries.
pub const WEBHOOK_CONNECT_TRIES: u32 = 3;

/// [`Helper`] over a configured [`HelperRunner`].
#[derive(Debug, Clone)]
pub struct SubprocessHelper(HelperRunner);

impl SubprocessHelper {
    /// The helper command of the `helper` setting, split shell-style (no shell is involved).
    pub fn new(command: &str) -> Result<Self, HelperError> {
        HelperRunner::new(command).map(SubprocessHelper)
    }
}

impl Helper for SubprocessHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        self.0.run(input).await
    }
}

/// [`Helper`] over a [`WebhookClient`]: one POST per node, tried again only when no connection
/// could be made, with the RPCs' backoff between tries.
#[derive(Debug, Clone)]
pub struct WebhookHelper {
    client: WebhookClient,
    backoff: Backoff,
    tries: u32,
}

/// The webhook options of `config`: its URL and files, the process helper's limits, and as
/// many pooled connections as there are workers.
pub fn webhook_options(config: &Config) -> WebhookOptions {
    let file = |s: &str| Some(PathBuf::from(s)).filter(|_| !s.is_empty());
    let w = &config.webhook;
    WebhookOptions {
        secret_file: file(&w.secret_file),
        client_cert: file(&w.tls_cert),
        client_key: file(&w.tls_key),
        ca: file(&w.tls_ca),
        max_idle: config.workers.max(1),
        reply_signature: w.reply_signature,
        ..WebhookOptions::new(config.helper.trim())
    }
}

impl WebhookHelper {
    /// A webhook helper for `config`, waiting `backoff` between the tries of a request that
    /// could not connect.
    pub fn new(config: &Config, backoff: Backoff) -> Result<Self, HelperError> {
        Ok(WebhookHelper {
            client: WebhookClient::new(&webhook_options(config))?,
            backoff,
            tries: WEBHOOK_CONNECT_TRIES,
        })
    }
}

impl Helper for WebhookHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        // Encoded once: every try sends the same bytes.
        let body = Bytes::from(helper_protocol::input_bytes(input)?);
        let mut try_no = 1;
        loop {
            match self.client.send(body.clone()).await {
                Ok(out) => return helper_protocol::decode_reply(&out, self.client.helper()),
                Err(e) if e.kind() == HelperErrorKind::Connect && try_no < self.tries => {
                    let delay: Duration = self.backoff.delay(try_no, &SystemRandom);
                    warn!(
                        identity = %provision_core::identity::escaped(&input.identity),
                        "helper try {try_no}/{} failed, trying again in {delay:?}: {e}",
                        self.tries
                    );
                    tokio::time::sleep(delay).await;
                    try_no += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The helper `config` names: a webhook for an `http://` or `https://` URL, else a command.
#[derive(Debug, Clone)]
pub enum SiteHelper {
    /// A command run for every node.
    Process(SubprocessHelper),
    /// A webhook POSTed to for every node.
    Webhook(WebhookHelper),
}

impl SiteHelper {
    /// The helper of `config`; `backoff` paces the webhook's tries after a refused connection.
    pub fn from_config(config: &Config, backoff: Backoff) -> Result<Self, HelperError> {
        if is_webhook(&config.helper) {
            WebhookHelper::new(config, backoff).map(SiteHelper::Webhook)
        } else {
            SubprocessHelper::new(&config.helper).map(SiteHelper::Process)
        }
    }
}

impl Helper for SiteHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        match self {
            SiteHelper::Process(h) => h.run(input).await,
            SiteHelper::Webhook(h) => h.run(input).await,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn config(url: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.yaml");
        std::fs::write(&path, format!("helper: {url}\nworkers: 2\n")).unwrap();
        Config::load(&path).unwrap().config
    }

    fn input() -> HelperInput {
        HelperInput {
            identity: "n1.example.net".into(),
            inventory: "{}".into(),
            ..Default::default()
        }
    }

    /// Reads one request's head and body from `s` (the body by its Content-Length).
    fn read_request(s: &mut std::net::TcpStream) {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut tmp).unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&tmp[..n]);
        }
        let head = String::from_utf8_lossy(&buf).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut have = buf.len() - end;
        while have < len {
            have += s.read(&mut tmp).unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_connection_is_tried_again_until_the_webhook_listens() {
        // The port is free now; the webhook starts listening only after the first try failed.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
            let (mut s, _) = l.accept().unwrap();
            read_request(&mut s);
            let body = r#"{"msg":"late","configuration":{"identity":"n1.example.net"}}"#;
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        });
        let cfg = config(&format!("http://127.0.0.1:{port}/p"));
        let helper =
            SiteHelper::from_config(&cfg, Backoff::fixed(vec![Duration::from_millis(400)]))
                .unwrap();
        assert!(matches!(helper, SiteHelper::Webhook(_)));
        let reply = helper.run(&input()).await.unwrap();
        assert_eq!(reply.msg, "late");
        server.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_connections_fail_after_three_tries() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = config(&format!("http://127.0.0.1:{port}/p"));
        let helper =
            SiteHelper::from_config(&cfg, Backoff::fixed(vec![Duration::from_millis(100)]))
                .unwrap();
        let started = std::time::Instant::now();
        let e = helper.run(&input()).await.unwrap_err();
        assert_eq!(e.kind(), HelperErrorKind::Connect, "{e}");
        // Two waits of 100 ms between three tries.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_was_sent_is_never_repeated() {
        // The webhook reads the request, then closes without answering.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&requests);
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                read_request(&mut s);
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        let cfg = config(&format!("http://127.0.0.1:{port}/p"));
        let helper =
            SiteHelper::from_config(&cfg, Backoff::fixed(vec![Duration::from_millis(10)])).unwrap();
        let e = helper.run(&input()).await.unwrap_err();
        assert_eq!(e.kind(), HelperErrorKind::Request, "{e}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(requests.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_command_is_a_process_helper() {
        let cfg = config("/bin/true --x");
        let helper = SiteHelper::from_config(&cfg, Backoff::fixed(Vec::new())).unwrap();
        assert!(matches!(helper, SiteHelper::Process(_)));
    }
}
