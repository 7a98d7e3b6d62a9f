//! Lying provisioning JWTs, served by every node, so every node must be refused: signed by an
//! unknown key, expired, not yet valid, `alg: none`, HS256 keyed with the verification key.
//! Forged with choria-crypto.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use choria_crypto::jwt::{self, SigningKey, TokenSignature};

use crate::harness::{setup, Env, Run, Setup};

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The claims of a provisioning JWT for the run's fleet, valid from `nbf` to `exp`.
pub fn prov_claims(run: &Run, nbf: i64, exp: i64) -> Value {
    serde_json::json!({
        "cht": run.provisioner.token, "chs": false, "chu": run.url, "chpd": true,
        "extensions": null, "ou": "choria", "purpose": "choria_provisioning",
        "iss": "Choria Tokens Package", "sub": "choria_provisioning",
        "exp": exp, "nbf": nbf, "iat": nbf, "jti": "faults"
    })
}

/// The ed25519 signing key whose hex seed is in `seed_file` (a signer the demo helper made).
pub fn signer(seed_file: &Path) -> Result<SigningKey> {
    let seed = std::fs::read_to_string(seed_file)
        .with_context(|| format!("cannot read {}", seed_file.display()))?;
    SigningKey::from_ed25519_seed_hex(seed.trim().as_bytes())
        .with_context(|| format!("{} is not an ed25519 seed", seed_file.display()))
}

enum Forge {
    WrongKey,
    Expired,
    NotYetValid,
    AlgNone,
    Hs256,
}

fn jwt_fault(env: &Env, name: &str, forge: Forge, words: &[&str]) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let now = unix_now();
    let flags: Vec<String> = match forge {
        Forge::WrongKey => {
            let other = run.dir.join("other-signer");
            test_support::stack::init_signer(&run.bins, &other)?;
            vec![
                "--provisioning-signer".into(),
                other.join("signer.seed").display().to_string(),
            ]
        }
        _ => {
            let (alg, nbf, exp) = match forge {
                Forge::Expired => ("EdDSA", now - 7200, now - 3600),
                Forge::NotYetValid => ("EdDSA", now + 86_400, now + 2 * 86_400),
                Forge::AlgNone => ("none", now, now + 3600),
                _ => ("HS256", now, now + 3600),
            };
            let claims = prov_claims(&run, nbf, exp);
            let key;
            let how = match alg {
                "EdDSA" => {
                    key = signer(&run.files.signer_seed)?;
                    TokenSignature::Key(&key)
                }
                "none" => TokenSignature::Empty,
                _ => TokenSignature::HmacSha256(run.files.signer_pub.as_bytes()),
            };
            let token = jwt::sign_with_alg(alg, &claims, how)?;
            let file = run.dir.join("forged.jwt");
            std::fs::write(&file, token)?;
            vec!["--provisioning-jwt".into(), file.display().to_string()]
        }
    };
    let nodes = 10;
    let sim = run.start_sim("fault", "n", nodes, &flags)?;
    let t1 = run.wait_errors(p, "every node to be refused", nodes as f64)?;
    std::thread::sleep(Duration::from_secs(1));
    let provisioned = run.metric(p, "choria_provisioner_provisioned");
    let report = sim.finish()?;
    ensure!(
        provisioned == 0.0,
        "{provisioned} nodes provisioned with a forged JWT"
    );
    let never = ["gen25519", "gencsr", "configure", "restart"];
    run.ensure_all_refused(p, &report, &never, words, "its JWT was forged")?;
    let t2 = run.provision_clear_fleet(p, nodes, &[], "with a genuine JWT")?;
    run.stop_all()?;
    Ok(format!(
        "all {nodes} refused in {:.1}s, nothing configured; provisioned {:.1}s after restarting with a genuine JWT",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

pub fn jwt_wrong_key(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::WrongKey, &["signature", "jwt"])
}
pub fn jwt_expired(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::Expired, &["expired"])
}
pub fn jwt_not_yet_valid(env: &Env, name: &str) -> Result<String> {
    jwt_fault(
        env,
        name,
        Forge::NotYetValid,
        &["not yet valid", "not valid yet"],
    )
}
pub fn jwt_alg_none(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::AlgNone, &["none", "algorithm"])
}
pub fn jwt_hs256(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::Hs256, &["hs256", "algorithm"])
}
