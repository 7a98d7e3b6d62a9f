//! The helper examples run and answer what the helper contract allows, and refuse what a hostile
//! node can send.
//!
//! The examples are every fenced block of `docs/helper.md` and `docs/upgrades.md` that starts
//! with `#!`, and every sample helper in `docs/examples/`; a sample named `webhook-*` is a webhook
//! helper: it is started as a server and every input is POSTed to it by the provisioner's own
//! webhook client, signed with a shared secret, its replies required to be signed (and refused
//! when unsigned, signed with another secret, sent again or stale). Each is run with the
//! documented input
//! (decoded first as the provisioner's own `HelperInput`), and its output must decode as the
//! provisioner's `HelperReply` with a configuration that leaves provisioning mode. The shipped
//! helpers (`docs/examples/` and `docs/helper.md`) are then run with hostile input: identities
//! that smuggle certificate names, wildcards, NATS wildcards, newlines or 5 KB, inventories of the
//! wrong shape, directories that are not plain paths. They must defer naming why, issue no
//! certificate and write nothing under the CA directory; a certificate they do issue names the
//! identity alone. Examples whose interpreter (jq, ruby) is missing are reported and skipped; the
//! Python ones always run, and the x509 ones need openssl.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;
use test_support::workspace_root as root;

use helper_protocol::signature::{self, REPLY_SIGNATURE_HEADER, REQUEST_SIGNATURE_HEADER};
use helper_protocol::webhook::{ReplySignature, REQUEST_ID_HEADER, TIMESTAMP_HEADER};
use helper_protocol::{WebhookClient, WebhookOptions};
use provision_core::helper_protocol::{HelperInput, HelperReply};
use provision_core::identity::IdentityRule;
use serde_json::{json, Value};
use test_support::ca::{self, KeyFormat, TestCa};

/// A directory removed when the test ends, one per test (the tests run at once).
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let d = std::env::temp_dir().join(format!("docs-helpers-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fenced blocks of a Markdown text as (language, body).
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match current.take() {
            Some((lang, body)) if t.starts_with("```") => out.push((lang, body)),
            Some((lang, body)) => current = Some((lang, body + line + "\n")),
            None if t.starts_with("```") => current = Some((t[3..].to_string(), String::new())),
            None => {}
        }
    }
    out
}

fn has(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What an example expects in its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Pki,
    Ed25519,
}

/// `cmd` with the site settings the samples read: the brokers, the CA in `ca`, the issuer.
fn with_site<'c>(cmd: &'c mut Command, ca: &Path) -> &'c mut Command {
    cmd.env("CHORIA_BROKERS", "nats://broker.example.net:4222")
        .env("CHORIA_CA_CERT", ca.join("ca.pem"))
        .env("CHORIA_CA_KEY", ca.join("ca-key.pem"))
        .env("CHORIA_ISSUER", "ab".repeat(32))
}

/// A webhook example serving on loopback, and the provisioner's client for it.
struct Webhook {
    _server: test_support::ProcessGuard,
    client: WebhookClient,
    url: String,
    runtime: tokio::runtime::Runtime,
}

impl Webhook {
    /// Starts `script` listening on a free port with the site settings of the samples and a
    /// secret in `dir`.
    fn start(script: &Path, dir: &Path, ca: &Path) -> Webhook {
        let port = test_support::free_port();
        let secret = dir.join(format!(
            "{}.secret",
            script.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&secret, "docs-webhook-secret\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let server = test_support::ProcessGuard::spawn(
            "webhook example",
            with_site(&mut Command::new(script), ca)
                .env("HELPER_SECRET_FILE", &secret)
                .env("HELPER_LISTEN", format!("127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .unwrap()
        .drop_grace(std::time::Duration::ZERO);
        test_support::ports::wait_port(port, std::time::Duration::from_secs(20)).unwrap();
        let url = format!("http://127.0.0.1:{port}/provision");
        // Every reply must come signed: the samples sign what they answer.
        let client = WebhookClient::new(&WebhookOptions {
            secret_file: Some(secret),
            reply_signature: ReplySignature::Required,
            ..WebhookOptions::new(&url)
        })
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Webhook {
            _server: server,
            client,
            url,
            runtime,
        }
    }

    /// POSTs `input` as the provisioner does; (2xx, body, error).
    fn post(&self, client: &WebhookClient, input: &Value) -> (bool, String, String) {
        let body = bytes::Bytes::from(input.to_string());
        match self.runtime.block_on(client.send(body)) {
            Ok(out) => (
                true,
                String::from_utf8_lossy(&out).into_owned(),
                String::new(),
            ),
            Err(e) => (false, String::new(), e.to_string()),
        }
    }
}

/// One helper example, written out as an executable script.
struct Example {
    /// Where it comes from, for messages.
    name: String,
    /// `sh`, `python` or `ruby`.
    lang: String,
    body: String,
    mode: Mode,
    /// Held to the hostile inputs: the shipped helpers (`docs/examples/`, `docs/helper.md`).
    shipped: bool,
    script: PathBuf,
    /// A webhook example's server, started when it is first asked.
    webhook: std::sync::OnceLock<Webhook>,
    /// Where a webhook example keeps its secret.
    dir: PathBuf,
}

impl Example {
    /// The interpreter it needs, when that is missing.
    fn missing(&self) -> Option<&'static str> {
        let needs = match self.lang.as_str() {
            "sh" => "jq",
            "python" => "python3",
            "ruby" => "ruby",
            other => panic!(
                "{}: helper example in an unexpected language {other}",
                self.name
            ),
        };
        (!has(needs)).then_some(needs)
    }

    fn is_webhook(&self) -> bool {
        self.name.starts_with("docs/examples/webhook-")
    }

    /// The webhook example's server, started on first use.
    fn webhook(&self, ca: &Path) -> &Webhook {
        self.webhook
            .get_or_init(|| Webhook::start(&self.script, &self.dir, ca))
    }

    /// Runs it with `input` and the site settings of the samples; (success, stdout, stderr).
    /// A webhook example gets `input` POSTed, signed: success is a 2xx answer, its body stdout.
    fn run(&self, input: &Value, ca: &Path) -> (bool, String, String) {
        if self.is_webhook() {
            let w = self.webhook(ca);
            return w.post(&w.client, input);
        }
        let out = test_support::process::run_with_input(
            with_site(&mut Command::new(&self.script), ca).stderr(Stdio::piped()),
            input.to_string().as_bytes(),
        )
        .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs it with `input`, which it must refuse (`what` names what is refused): a deferral
    /// whose message starts `refused: ` and holds `why`, and no certificate.
    fn refuses(&self, input: &Value, ca: &Path, what: &str, why: &str) -> HelperReply {
        let (reply, stdout) = self.reply(input, ca);
        assert!(reply.defer, "{} did not refuse {what}: {stdout}", self.name);
        assert!(
            reply.msg.starts_with("refused: ") && reply.msg.contains(why),
            "{} refused {what} without saying why: {:?}",
            self.name,
            reply.msg
        );
        assert!(
            !stdout.contains("BEGIN CERTIFICATE") && reply.certificate.is_empty(),
            "{} issued a certificate for {what}",
            self.name
        );
        reply
    }

    /// Runs it and decodes the reply, which must come with exit code 0.
    fn reply(&self, input: &Value, ca: &Path) -> (HelperReply, String) {
        let (ok, stdout, stderr) = self.run(input, ca);
        assert!(
            ok,
            "{} failed with identity {:?}: {stderr}",
            self.name, input["identity"]
        );
        let reply = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{} answered {stdout:?}: {e}", self.name));
        (reply, stdout)
    }
}

fn lang_of_shebang(body: &str) -> String {
    let first = body.lines().next().unwrap_or_default();
    if first.contains("python") {
        "python".into()
    } else if first.contains("ruby") {
        "ruby".into()
    } else if first.ends_with("/sh") || first.ends_with("bash") {
        "sh".into()
    } else {
        panic!("unexpected interpreter {first}")
    }
}

/// Every helper example, written as scripts into `dir`; the x509 ones read their CA from `ca`.
fn examples(dir: &Path, ca: &Path) -> Vec<Example> {
    let mut found = Vec::new();
    for (page, shipped) in [("helper.md", true), ("upgrades.md", false)] {
        let text = std::fs::read_to_string(root().join("docs").join(page)).unwrap();
        for (i, (lang, body)) in blocks(&text).into_iter().enumerate() {
            if body.starts_with("#!") {
                found.push((
                    format!("the {lang} example {i} of {page}"),
                    lang,
                    body,
                    shipped,
                ));
            }
        }
    }
    // Files only: docs/examples/policies/ holds the sample policies, not helpers.
    let mut files: Vec<_> = std::fs::read_dir(root().join("docs/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for path in files {
        let body = std::fs::read_to_string(&path).unwrap();
        let name = format!(
            "docs/examples/{}",
            path.file_name().unwrap().to_string_lossy()
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "{name} is not executable");
        assert!(body.starts_with("#!"), "{name} has no #! line");
        found.push((name, lang_of_shebang(&body), body, true));
    }
    found
        .into_iter()
        .enumerate()
        .map(|(n, (name, lang, body, shipped))| {
            // The x509 example of the documentation reads its CA from /etc/choria-provisioner/ca/.
            let body = body.replace("/etc/choria-provisioner/ca/", &format!("{}/", ca.display()));
            let mode = if body.contains("\"certificate\"") {
                Mode::Pki
            } else if body.contains("ed25519_pubkey") {
                Mode::Ed25519
            } else {
                Mode::Plain
            };
            let script = dir.join(format!("helper-{n}"));
            std::fs::write(&script, &body).unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            Example {
                name,
                lang,
                body,
                mode,
                shipped,
                script,
                webhook: std::sync::OnceLock::new(),
                dir: dir.to_path_buf(),
            }
        })
        .collect()
}

/// The examples `keep` selects that can run here: their interpreter installed, and openssl for
/// an x509 one unless `openssl` says it is there. Each one passed over is reported.
fn runnable<'a>(
    all: &'a [Example],
    openssl: bool,
    keep: impl Fn(&Example) -> bool + 'a,
) -> impl Iterator<Item = &'a Example> + 'a {
    all.iter().filter(move |ex| {
        if !keep(ex) {
            return false;
        }
        let needs = ex
            .missing()
            .or((ex.mode == Mode::Pki && !openssl).then_some("openssl"));
        if let Some(needs) = needs {
            println!("skipped {}: {needs} is not installed", ex.name);
        }
        needs.is_none()
    })
}

fn openssl(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The test CA in `ca`; false when openssl is missing.
fn make_ca(ca: &Path) -> bool {
    if !has("openssl") {
        return false;
    }
    std::fs::create_dir_all(ca).unwrap();
    TestCa::new(ca).unwrap();
    true
}

/// A CSR for `subject` (asking for `sans` as its subjectAltName) made in `dir` with one key kept
/// there; `None` when openssl refuses the subject (it limits a CN to 64 bytes).
fn csr(dir: &Path, subject: &str, sans: &[&str]) -> Option<String> {
    let key = dir.join("key.pem");
    if !key.exists() {
        ca::rsa_key(&key, KeyFormat::Pkcs8).unwrap();
    }
    let out = dir.join("req.pem");
    ca::request(&key, subject, sans, &out)
        .ok()
        .map(|()| std::fs::read_to_string(out).unwrap())
}

fn sans(dir: &Path, cert: &str) -> Vec<String> {
    test_support::ca::cert_sans(dir, cert).unwrap()
}

fn snapshot(dir: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    test_support::ca::files_snapshot(dir).unwrap()
}

/// The documented input, as the provisioner's `HelperInput` and as JSON.
fn documented_input() -> (HelperInput, Value) {
    let helper_md = std::fs::read_to_string(root().join("docs/helper.md")).unwrap();
    let (_, input_text) = blocks(&helper_md)
        .into_iter()
        .find(|(lang, body)| lang == "json" && body.contains("\"inventory\""))
        .expect("helper.md documents an input");
    let input: HelperInput = serde_json::from_str(&input_text).unwrap();
    assert_eq!(input.identity, "node1.example.net");
    let inventory: Value = serde_json::from_str(&input.inventory).unwrap();
    assert!(inventory.get("facts").is_some());
    let value = serde_json::to_value(&input).unwrap();
    (input, value)
}

/// The input for an example of `mode`, with `identity` and, for x509, `csr`.
fn input_for(base: &Value, mode: Mode, identity: Value, csr: Option<&str>) -> Value {
    let mut node = base.clone();
    node["identity"] = identity;
    match mode {
        Mode::Plain => {}
        Mode::Pki => {
            node["csr"] =
                json!({"csr": csr.unwrap(), "public_key": "", "ssldir": "/etc/choria/ssl"});
        }
        Mode::Ed25519 => {
            node["ed25519_pubkey"] = json!({
                "public_key": "ab".repeat(32), "directory": "/etc/choria", "signature": "cd".repeat(64)
            });
        }
    }
    node
}

/// The identities a node holding a provisioning JWT can announce to get more than its due.
fn hostile_identities() -> Vec<String> {
    vec![
        // A certificate extension that names a privileged client besides the node.
        "evil.example.net,DNS:admin.privileged.mcollective,DNS:x".into(),
        // A wildcard certificate; `endswith(".example.net")` passes it.
        "*.example.net".into(),
        // A NATS wildcard: a server JWT for `>` subscribes to every directed request.
        ">".into(),
        // A forged line in a log or a configuration file.
        "node1.example.net\nplugin.security.provider = none".into(),
        // A trailing newline: passes a check anchored with `$` in Python, jq or Ruby.
        "node1.example.net\n".into(),
        // Longer than any DNS name, and than a NATS control line.
        format!("{}.example.net", "a".repeat(4988)),
        "node1..example.net".into(),
        "../../etc/passwd".into(),
        String::new(),
        // Names of the grammar that are Choria client names.
        "admin.privileged.mcollective".into(),
        "web.privileged.choria".into(),
    ]
}

#[test]
fn the_documented_helpers_answer_within_the_contract() {
    let dir = TempDir::new("contract");
    let ca = dir.path().join("ca");
    let have_openssl = make_ca(&ca);
    let (input, base) = documented_input();
    // The CSR asks for a privileged name besides the identity: a certificate names the identity
    // alone.
    let csr = have_openssl
        .then(|| {
            csr(
                dir.path(),
                &format!("/CN={}", input.identity),
                &[
                    "admin.privileged.mcollective",
                    "node1.example.net",
                    "10.0.0.1",
                ],
            )
        })
        .flatten();

    let all = examples(dir.path(), &ca);
    let mut ran_python = 0;
    for ex in runnable(&all, csr.is_some(), |_| true) {
        let node = input_for(&base, ex.mode, json!(input.identity), csr.as_deref());
        let (reply, _) = ex.reply(&node, &ca);
        assert!(
            !reply.defer && !reply.shutdown,
            "{} deferred: {}",
            ex.name,
            reply.msg
        );
        let config = reply.configuration.expect("a configuration");
        assert_eq!(config.get("identity"), Some(&input.identity), "{}", ex.name);
        assert_eq!(
            config
                .get("plugin.choria.server.provision")
                .map(String::as_str),
            Some("false"),
            "{} would provision the server again after its restart",
            ex.name
        );
        if ex.mode == Mode::Pki {
            assert!(reply.certificate.contains("BEGIN CERTIFICATE"));
            assert!(reply.ca.contains("BEGIN CERTIFICATE"));
            assert_eq!(
                sans(dir.path(), &reply.certificate),
                [format!("DNS:{}", input.identity)],
                "{}: the certificate must name the identity alone",
                ex.name
            );
            let verified = openssl(
                dir.path(),
                &[
                    "verify",
                    "-CAfile",
                    &ca.join("ca.pem").display().to_string(),
                    "issued.pem",
                ],
            );
            assert!(verified.contains("OK"), "{}: {verified}", ex.name);
        }
        if ex.mode == Mode::Ed25519 {
            let claims = reply.server_claims.expect("server claims");
            if ex.body.contains("\"exp\"") {
                let exp = claims.standard.expires_at.expect("an expiry");
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
                assert!(
                    exp > now + 3600,
                    "exp {exp} must be an absolute time in the future"
                );
            }
        }
        if ex.lang == "python" {
            ran_python += 1;
        }
    }
    let shipped_files = all
        .iter()
        .filter(|e| e.name.starts_with("docs/examples/"))
        .count();
    assert!(shipped_files >= 4, "only {shipped_files} sample helpers");
    assert!(all.len() >= 9, "only {} helper examples found", all.len());
    assert!(ran_python >= 5, "the Python examples must run");
}

#[test]
fn the_shipped_helpers_refuse_hostile_identities() {
    let dir = TempDir::new("hostile");
    let ca = dir.path().join("ca");
    let have_openssl = make_ca(&ca);
    let (_, base) = documented_input();
    let good_csr = have_openssl
        .then(|| csr(dir.path(), "/CN=node1.example.net", &[]))
        .flatten();
    let ca_before = have_openssl.then(|| snapshot(&ca));

    let mut identities: Vec<Value> = hostile_identities().into_iter().map(Value::from).collect();
    identities.extend([json!(null), json!(42), json!(["node1.example.net"])]);
    let mut refused = 0;
    let all = examples(dir.path(), &ca);
    for ex in runnable(&all, good_csr.is_some(), |e| e.shipped) {
        for identity in &identities {
            // The attack as sent: a CSR whose common name is the identity, where openssl can
            // make one; else a good CSR, which must not matter.
            let own_csr = match (ex.mode, identity.as_str()) {
                (Mode::Pki, Some(id)) => csr(dir.path(), &format!("/CN={id}"), &[]),
                _ => None,
            };
            let node = input_for(
                &base,
                ex.mode,
                identity.clone(),
                own_csr.as_deref().or(good_csr.as_deref()),
            );
            let reply = ex.refuses(&node, &ca, &format!("identity {identity}"), "");
            assert!(
                reply.configuration.is_none() && reply.server_claims.is_none(),
                "{} configured {identity}",
                ex.name
            );
            refused += 1;
        }
    }
    if let Some(before) = ca_before {
        assert_eq!(
            snapshot(&ca),
            before,
            "a helper wrote under the CA directory"
        );
    }
    // At least the Python samples and the Python example of helper.md ran.
    assert!(refused >= 4 * identities.len(), "only {refused} refusals");
}

#[test]
fn the_shipped_helpers_use_the_provisioners_grammar() {
    let dir = TempDir::new("grammar");
    let ca = dir.path().join("ca");
    let (_, base) = documented_input();
    let rule = IdentityRule::builtin();
    let label = |c: char, n: usize| c.to_string().repeat(n);
    let in_domain = |name: String| format!("{name}.example.net");
    // 253 bytes: 63 + 1 + 63 + 1 + 63 + 1 + 49 + 12 (".example.net").
    let longest = format!(
        "{}.{}.{}.{}.example.net",
        label('a', 63),
        label('b', 63),
        label('c', 63),
        label('d', 49)
    );
    let candidates = vec![
        "node1.example.net".to_string(),
        in_domain(label('a', 63)),
        in_domain(label('a', 64)),
        longest.clone(),
        format!("a{longest}"),
        "node_1.example.net".into(),
        "-node.example.net".into(),
        "Node1.Example.NET".into(),
        "node1.example.net.".into(),
        ".example.net".into(),
        "nöde.example.net".into(),
        "node 1.example.net".into(),
        "node1.example.net\r".into(),
        "node1\u{0}.example.net".into(),
        "node1.exa:mple.net".into(),
        "node1.example.net/x".into(),
    ];
    let all = examples(dir.path(), &ca);
    for ex in runnable(&all, true, |e| e.shipped && e.mode != Mode::Pki) {
        // The Python example of helper.md serves example.net alone, in lower case.
        let site_filter = ex.body.contains(r"example\.net");
        for identity in &candidates {
            let core_accepts = rule.check(identity).is_ok();
            let node = input_for(&base, ex.mode, json!(identity), None);
            let (reply, stdout) = ex.reply(&node, &ca);
            if !core_accepts {
                assert!(
                    reply.defer,
                    "{} accepted {identity:?}, which the provisioner refuses: {stdout}",
                    ex.name
                );
            } else if !site_filter
                || identity
                    .bytes()
                    .all(|b| !b.is_ascii_uppercase() && b != b'_')
            {
                assert!(
                    !reply.defer,
                    "{} refused {identity:?}, which the provisioner accepts: {}",
                    ex.name, reply.msg
                );
            }
        }
    }
    assert_eq!(longest.len(), 253);
    assert!(rule.check(&longest).is_ok());
    assert!(rule.check(&format!("a{longest}")).is_err());
}

#[test]
fn the_shipped_helpers_survive_hostile_inventories_and_directories() {
    let dir = TempDir::new("fields");
    let ca = dir.path().join("ca");
    let have_openssl = make_ca(&ca);
    let (_, base) = documented_input();
    let good_csr = have_openssl
        .then(|| csr(dir.path(), "/CN=node1.example.net", &[]))
        .flatten();
    let web = json!({"facts": {"role": "web"}}).to_string();
    let inventories = [
        json!("[1]"),
        json!("not json"),
        json!(""),
        json!(null),
        json!(5),
        json!({"facts": {"role": "web"}}),
        json!("{\"facts\": \"web\"}"),
        json!("{\"facts\": {\"role\": {\"web\": true}}}"),
        json!("{\"facts\": {\"role\": [\"web\"]}}"),
        json!(format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000))),
    ];
    let directories = [
        json!("/etc/choria\nplugin.security.provider = none"),
        json!("etc/choria"),
        json!("/etc/choria/../../root"),
        json!("/etc/cho ria"),
        json!(["/etc/choria"]),
        json!(7),
    ];
    let all = examples(dir.path(), &ca);
    for ex in runnable(&all, true, |e| e.shipped) {
        match ex.mode {
            Mode::Plain if ex.body.contains("inventory") => {
                // A fact is compared with a fixed value, or not used at all.
                let mut node = input_for(&base, ex.mode, json!("node1.example.net"), None);
                node["inventory"] = json!(web);
                let (reply, _) = ex.reply(&node, &ca);
                let config = reply.configuration.expect("a configuration");
                assert!(config.contains_key("classesfile"), "{}", ex.name);
                for inventory in &inventories {
                    node["inventory"] = inventory.clone();
                    let (reply, stdout) = ex.reply(&node, &ca);
                    let config = reply.configuration.unwrap_or_else(|| {
                        panic!("{}: inventory {inventory:.60}: {stdout}", ex.name)
                    });
                    assert!(
                        !config.contains_key("classesfile"),
                        "{}: inventory {inventory:.60}",
                        ex.name
                    );
                }
            }
            Mode::Plain => {}
            Mode::Pki | Mode::Ed25519 => {
                let Some(csr) = &good_csr else {
                    println!("skipped {}: openssl is not installed", ex.name);
                    continue;
                };
                let before = snapshot(&ca);
                for d in &directories {
                    let mut node = input_for(&base, ex.mode, json!("node1.example.net"), Some(csr));
                    if ex.mode == Mode::Pki {
                        node["csr"]["ssldir"] = d.clone();
                    } else {
                        node["ed25519_pubkey"]["directory"] = d.clone();
                    }
                    ex.refuses(&node, &ca, &format!("directory {d}"), "");
                }
                assert_eq!(snapshot(&ca), before, "{} wrote under the CA", ex.name);
            }
        }
    }
}

#[test]
fn the_x509_helpers_sign_only_a_csr_of_the_identity() {
    let dir = TempDir::new("csr");
    let ca = dir.path().join("ca");
    if !make_ca(&ca) {
        println!("skipped: openssl is not installed");
        return;
    }
    let (_, base) = documented_input();
    let before = snapshot(&ca);
    let mismatched: Vec<(&str, String)> = [
        "/CN=other.example.net",
        "/CN=node1.example.net/CN=admin.privileged.mcollective",
        "/O=Example",
        "/CN=node1.example.net\\/CN=x",
    ]
    .into_iter()
    .map(|s| (s, csr(dir.path(), s, &[]).unwrap()))
    .collect();
    let mut checked = 0;
    let all = examples(dir.path(), &ca);
    for ex in runnable(&all, true, |e| e.shipped && e.mode == Mode::Pki) {
        for (subject, csr) in &mismatched {
            let node = input_for(&base, ex.mode, json!("node1.example.net"), Some(csr));
            ex.refuses(&node, &ca, &format!("a CSR for {subject}"), "common name");
        }
        // A CSR whose signature does not verify.
        let good = csr(dir.path(), "/CN=node1.example.net", &[]).unwrap();
        // One base64 character changed in the last full line, inside the signature.
        let lines: Vec<&str> = good.lines().collect();
        let target = lines.len() - 3;
        assert_eq!(lines[target].len(), 64);
        let mut line = lines[target].to_string();
        let c = if &line[10..11] == "A" { "B" } else { "A" };
        line.replace_range(10..11, c);
        let mut changed = lines.clone();
        changed[target] = &line;
        let broken = changed.join("\n") + "\n";
        assert_ne!(broken, good);
        let node = input_for(&base, ex.mode, json!("node1.example.net"), Some(&broken));
        let (ok, stdout, _) = ex.run(&node, &ca);
        assert!(!stdout.contains("BEGIN CERTIFICATE"), "{}", ex.name);
        if ok {
            let reply: HelperReply = serde_json::from_str(&stdout).unwrap();
            assert!(reply.defer, "{} signed a CSR that does not verify", ex.name);
            assert!(reply.certificate.is_empty());
        }
        checked += 1;
    }
    assert!(checked >= 1, "helper-pki.py must run");
    assert_eq!(
        snapshot(&ca),
        before,
        "a helper wrote under the CA directory"
    );
}

/// The headers of a request signed (version 2) with `secret` at `timestamp` with `id`.
fn signed_headers(
    secret: &[u8],
    timestamp: u64,
    id: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let ts = timestamp.to_string();
    let sig = signature::sign_request(secret, ts.as_bytes(), id.as_bytes(), body);
    vec![
        (TIMESTAMP_HEADER, ts),
        (REQUEST_ID_HEADER, id.to_string()),
        (REQUEST_SIGNATURE_HEADER, sig),
    ]
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// POSTs `body` to `url` with exactly these extra headers, on a connection of its own, and
/// reads the answer to its end: (status, headers, body).
fn raw_post(
    url: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, String) {
    use std::io::Read as _;
    let mut s = test_support::webhook::raw_post(url, headers, body).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    (
        status,
        headers,
        String::from_utf8_lossy(&answer[end + 4..]).into_owned(),
    )
}

#[test]
fn the_webhook_examples_refuse_requests_that_are_not_signed_with_the_secret() {
    let dir = TempDir::new("webhook-signature");
    let ca = dir.path().join("ca");
    let (_, base) = documented_input();
    let node = input_for(&base, Mode::Plain, json!("node1.example.net"), None);
    let mut checked = 0;
    let all = examples(dir.path(), &ca);
    for ex in runnable(&all, true, Example::is_webhook) {
        let w = ex.webhook(&ca);
        // Signed with the shared secret: answered.
        let (ok, stdout, stderr) = w.post(&w.client, &node);
        assert!(ok, "{}: {stderr}", ex.name);
        let reply: HelperReply = serde_json::from_str(&stdout).unwrap();
        assert!(reply.configuration.is_some(), "{}: {stdout}", ex.name);
        // Unsigned, and signed with another secret: 401, nothing configured.
        let other = dir.path().join("other.secret");
        std::fs::write(&other, "not-the-shared-secret").unwrap();
        let unsigned = WebhookClient::new(&WebhookOptions::new(&w.url)).unwrap();
        let wrong = WebhookClient::new(&WebhookOptions {
            secret_file: Some(other),
            ..WebhookOptions::new(&w.url)
        })
        .unwrap();
        for client in [&unsigned, &wrong] {
            let (ok, stdout, stderr) = w.post(client, &node);
            assert!(!ok, "{} answered an unsigned request: {stdout}", ex.name);
            assert!(stderr.contains("HTTP 401"), "{}: {stderr}", ex.name);
        }
        // The probe (a signed GET) is answered, and its answer signed.
        let probe = w.runtime.block_on(w.client.probe()).unwrap();
        assert_eq!(probe.status, 200, "{}", ex.name);
        assert_eq!(
            probe.reply_signature,
            Ok(signature::ReplyCheck::Signed),
            "{}",
            ex.name
        );
        // A request sent twice is answered once; one signed more than five minutes ago or
        // ahead is refused; the version 1 signature alone is refused.
        let secret = b"docs-webhook-secret";
        let body = node.to_string().into_bytes();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let first = signed_headers(secret, now, "0123456789abcdef0123456789abcdef", &body);
        let (status, headers, reply) = raw_post(&w.url, &first, &body);
        assert_eq!(status, 200, "{}: {reply}", ex.name);
        let reply_signature = header(&headers, REPLY_SIGNATURE_HEADER).unwrap();
        assert_eq!(
            signature::verify_reply(
                secret,
                b"0123456789abcdef0123456789abcdef",
                reply.as_bytes(),
                reply_signature.as_bytes()
            ),
            Ok(()),
            "{}",
            ex.name
        );
        let (status, _, reply) = raw_post(&w.url, &first, &body);
        assert_eq!(
            status, 401,
            "{} answered a replayed request: {reply}",
            ex.name
        );
        // A minute past the window either way: the server reads its clock later than this
        // test did, and on a loaded machine that can be seconds later.
        for (n, ts) in [now - 360, now + 360].into_iter().enumerate() {
            let id = format!("{n:032x}");
            let (status, _, reply) =
                raw_post(&w.url, &signed_headers(secret, ts, &id, &body), &body);
            assert_eq!(status, 401, "{} answered a stale request: {reply}", ex.name);
        }
        let ts = now.to_string();
        let id = "fedcba9876543210fedcba9876543210";
        let v1 = helper_protocol::webhook::signature(secret, &ts, id, &body);
        let v1_only = [
            (TIMESTAMP_HEADER, ts.clone()),
            (REQUEST_ID_HEADER, id.to_string()),
            (helper_protocol::webhook::SIGNATURE_HEADER, v1),
        ];
        let (status, _, reply) = raw_post(&w.url, &v1_only, &body);
        assert_eq!(
            status, 401,
            "{} answered a version 1 signature: {reply}",
            ex.name
        );
        checked += 1;
    }
    assert!(checked >= 1, "no webhook example ran");
}
