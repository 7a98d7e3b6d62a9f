//! Typed clients for `rpcutil#inventory`, `rpcutil#daemon_stats` and every `choria_provision` action, with inputs and
//! outputs as in the agents' DDL (input defaults that are not `null` are always sent, as the
//! generated Go clients do). The types are named after the DDL's sides: `<Action>Input` is what a
//! request carries, `<Action>Output` what the reply's data holds.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::rpc::{RequestError, RequestErrorKind, RpcClient};

/// Agent name of the provisioning agent.
pub const PROVISION_AGENT: &str = "choria_provision";

/// Agent name of the utility agent.
pub const RPCUTIL_AGENT: &str = "rpcutil";

/// The `timeout` of the `choria_provision` agent's DDL (go-choria's generated client).
pub const PROVISION_DDL_TIMEOUT: Duration = Duration::from_secs(20);

/// The `timeout` of the `rpcutil` agent's DDL (go-choria's generated client).
pub const RPCUTIL_DDL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long go-choria's RPC client waits for the replies to one request: the Choria
/// configuration's `discovery_timeout` (a measure of the network's round trip, discovery being
/// the smallest request) plus the agent DDL's `timeout` (how long the action may run). Every
/// action of an agent gets the same timeout.
pub fn request_timeout(discovery_timeout: Duration, ddl_timeout: Duration) -> Duration {
    discovery_timeout.saturating_add(ddl_timeout)
}

/// `rpcutil#inventory` reply data: typed fields plus the whole data object as received.
#[derive(Debug, Clone, PartialEq)]
pub struct InventoryOutput {
    /// Active agents.
    pub agents: Vec<String>,
    /// Classes.
    pub classes: Vec<String>,
    /// Collectives.
    pub collectives: Vec<String>,
    /// Data plugins.
    pub data_plugins: Vec<String>,
    /// Facts object.
    pub facts: serde_json::Value,
    /// Autonomous agents (`name`, `state`, `version`).
    pub machines: Vec<serde_json::Value>,
    /// Main collective.
    pub main_collective: String,
    /// Server version.
    pub version: String,
    /// Whether in-place upgrades are allowed (DDL default `false`).
    pub upgradable: bool,
    /// The reply data exactly as received (for the helper).
    pub raw: serde_json::Value,
}

#[derive(Deserialize)]
struct InventoryWire {
    #[serde(default)]
    agents: Vec<String>,
    #[serde(default)]
    classes: Vec<String>,
    #[serde(default)]
    collectives: Vec<String>,
    #[serde(default)]
    data_plugins: Vec<String>,
    #[serde(default)]
    facts: serde_json::Value,
    #[serde(default)]
    machines: Vec<serde_json::Value>,
    #[serde(default)]
    main_collective: String,
    version: String,
    #[serde(default)]
    upgradable: bool,
}

/// `choria_provision#jwt` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JwtOutput {
    /// The node's `provisioning.jwt`, verbatim.
    #[serde(default)]
    pub jwt: String,
    /// The node's fresh X25519 public key (64 hex characters).
    #[serde(default)]
    pub ecdh_public: String,
}

/// `choria_provision#gen25519` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gen25519Output {
    /// ed25519 public key, 64 hex characters.
    #[serde(default)]
    pub public_key: String,
    /// Directory the seed was written to.
    #[serde(default)]
    pub directory: String,
    /// Signature of the nonce, 128 hex characters.
    #[serde(default)]
    pub signature: String,
}

/// `choria_provision#gencsr` inputs besides the token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GencsrInput {
    /// Common name (default: the node's certname).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cn: Option<String>,
    /// Country (two upper-case letters).
    #[serde(rename = "c", skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// Locality.
    #[serde(rename = "l", skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    /// Organisation.
    #[serde(rename = "o", skip_serializing_if = "Option::is_none")]
    pub organization: Option<String>,
    /// Organisational unit.
    #[serde(rename = "ou", skip_serializing_if = "Option::is_none")]
    pub organizational_unit: Option<String>,
    /// State (accepted and ignored by the server).
    #[serde(rename = "st", skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// `choria_provision#gencsr` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GencsrOutput {
    /// The CSR PEM.
    #[serde(default)]
    pub csr: String,
    /// The public key PEM (labelled `PUBLIC KEY`, PKCS#1 content).
    #[serde(default)]
    pub public_key: String,
    /// The node's SSL directory.
    #[serde(default)]
    pub ssldir: String,
}

/// `choria_provision#configure` inputs besides the token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConfigureInput {
    /// The configuration, a JSON object of string values, as text.
    pub config: String,
    /// Certificate PEM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// CA PEM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// SSL directory on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssldir: Option<String>,
    /// Encrypted private key PEM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Provisioner's X25519 public key (hex), `""` by default.
    pub ecdh_public: String,
    /// Action policies, file name to content.
    pub action_policies: BTreeMap<String, String>,
    /// Open Policy Agent policies, file name to content.
    pub opa_policies: BTreeMap<String, String>,
    /// Server JWT, `""` by default.
    pub server_jwt: String,
}

/// What the provisioner reads of `rpcutil#daemon_stats`: when the server process started and
/// its version (go-choria's `DaemonStatsReply` carries counters too, which are ignored).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DaemonStatsOutput {
    /// When the server process started, Unix seconds.
    pub starttime: i64,
    /// Server version.
    #[serde(default)]
    pub version: String,
}

/// The `{message}` reply of configure, restart, shutdown, reprovision and release_update.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MessageOutput {
    /// The node's message.
    #[serde(default)]
    pub message: String,
}

#[derive(Serialize)]
struct WithToken<'a, T: Serialize> {
    token: &'a str,
    #[serde(flatten)]
    rest: T,
}

#[derive(Serialize)]
struct NoInputs {}

impl RpcClient {
    async fn typed<I: Serialize, O: DeserializeOwned>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        input: &I,
        timeout: Duration,
    ) -> Result<(O, serde_json::Value), RequestError> {
        let data = self.call(identity, agent, action, input, timeout).await?;
        let out = O::deserialize(&data).map_err(|e| {
            RequestError::new(
                identity,
                format!("{agent}#{action}"),
                RequestErrorKind::BadReply,
            )
            .with_source(e)
        })?;
        Ok((out, data))
    }

    async fn provision<I: Serialize, O: DeserializeOwned>(
        &self,
        identity: &str,
        action: &str,
        token: &str,
        rest: I,
        timeout: Duration,
    ) -> Result<O, RequestError> {
        self.call_as(
            identity,
            PROVISION_AGENT,
            action,
            &WithToken { token, rest },
            timeout,
        )
        .await
    }

    /// `rpcutil#inventory`. A reply without a string `version` is a bad reply.
    pub async fn inventory(
        &self,
        identity: &str,
        timeout: Duration,
    ) -> Result<InventoryOutput, RequestError> {
        let (w, raw): (InventoryWire, _) = self
            .typed(identity, RPCUTIL_AGENT, "inventory", &NoInputs {}, timeout)
            .await?;
        Ok(InventoryOutput {
            agents: w.agents,
            classes: w.classes,
            collectives: w.collectives,
            data_plugins: w.data_plugins,
            facts: w.facts,
            machines: w.machines,
            main_collective: w.main_collective,
            version: w.version,
            upgradable: w.upgradable,
            raw,
        })
    }

    /// `rpcutil#daemon_stats`. A reply without a numeric `starttime` is a bad reply.
    pub async fn daemon_stats(
        &self,
        identity: &str,
        timeout: Duration,
    ) -> Result<DaemonStatsOutput, RequestError> {
        self.call_as(
            identity,
            RPCUTIL_AGENT,
            "daemon_stats",
            &NoInputs {},
            timeout,
        )
        .await
    }

    /// `choria_provision#jwt`.
    pub async fn provision_jwt(
        &self,
        identity: &str,
        token: &str,
        timeout: Duration,
    ) -> Result<JwtOutput, RequestError> {
        self.provision(identity, "jwt", token, NoInputs {}, timeout)
            .await
    }

    /// `choria_provision#gen25519` with a nonce to sign.
    pub async fn provision_gen25519(
        &self,
        identity: &str,
        token: &str,
        nonce: &str,
        timeout: Duration,
    ) -> Result<Gen25519Output, RequestError> {
        #[derive(Serialize)]
        struct I<'a> {
            nonce: &'a str,
        }
        self.provision(identity, "gen25519", token, I { nonce }, timeout)
            .await
    }

    /// `choria_provision#gencsr`.
    pub async fn provision_gencsr(
        &self,
        identity: &str,
        token: &str,
        req: &GencsrInput,
        timeout: Duration,
    ) -> Result<GencsrOutput, RequestError> {
        self.provision(identity, "gencsr", token, req, timeout)
            .await
    }

    /// `choria_provision#configure`.
    pub async fn provision_configure(
        &self,
        identity: &str,
        token: &str,
        req: &ConfigureInput,
        timeout: Duration,
    ) -> Result<MessageOutput, RequestError> {
        self.provision(identity, "configure", token, req, timeout)
            .await
    }

    /// `choria_provision#release_update` to `version` from `repository`.
    pub async fn provision_release_update(
        &self,
        identity: &str,
        token: &str,
        repository: &str,
        version: &str,
        timeout: Duration,
    ) -> Result<MessageOutput, RequestError> {
        #[derive(Serialize)]
        struct I<'a> {
            repository: &'a str,
            version: &'a str,
        }
        self.provision(
            identity,
            "release_update",
            token,
            I {
                repository,
                version,
            },
            timeout,
        )
        .await
    }

    /// `choria_provision#restart`, with an optional splay in whole seconds.
    pub async fn provision_restart(
        &self,
        identity: &str,
        token: &str,
        splay: Option<u32>,
        timeout: Duration,
    ) -> Result<MessageOutput, RequestError> {
        #[derive(Serialize)]
        struct I {
            #[serde(skip_serializing_if = "Option::is_none")]
            splay: Option<u32>,
        }
        self.provision(identity, "restart", token, I { splay }, timeout)
            .await
    }

    /// `choria_provision#shutdown`.
    pub async fn provision_shutdown(
        &self,
        identity: &str,
        token: &str,
        timeout: Duration,
    ) -> Result<MessageOutput, RequestError> {
        self.provision(identity, "shutdown", token, NoInputs {}, timeout)
            .await
    }

    /// `choria_provision#reprovision`.
    pub async fn provision_reprovision(
        &self,
        identity: &str,
        token: &str,
        timeout: Duration,
    ) -> Result<MessageOutput, RequestError> {
        self.provision(identity, "reprovision", token, NoInputs {}, timeout)
            .await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn inputs_serialise_as_the_go_client_sends_them() {
        let c = ConfigureInput {
            config: "{}".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(WithToken {
            token: "t",
            rest: &c,
        })
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"token":"t","config":"{}","ecdh_public":"","action_policies":{},"opa_policies":{},"server_jwt":""})
        );
        let g = GencsrInput {
            country: Some("DE".into()),
            ..Default::default()
        };
        let v = serde_json::to_value(WithToken {
            token: "t",
            rest: &g,
        })
        .unwrap();
        assert_eq!(v, serde_json::json!({"token":"t","c":"DE"}));
    }
}
