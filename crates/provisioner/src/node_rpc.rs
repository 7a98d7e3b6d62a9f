//! The provisioning cycle's [`NodeRpc`] implemented with the Choria RPC client: the one place
//! where the client's wire types become the core's domain types.

use std::time::Duration;

use choria_rpc_client::agents::{self, ConfigureInput as WireConfigure, GencsrInput};
use choria_rpc_client::rpc::{RequestError as WireError, RequestErrorKind as WireKind, RpcClient};
use provision_core::helper_protocol::{CsrReply, Ed25519Reply};
use provision_core::rpc::{
    Action, ActionMessage, ConfigureRequest, Inventory, JwtReply, NodeRpc, RpcError, RpcErrorKind,
};

/// Request timeouts as the Go provisioner's generated clients compute them: the Choria
/// configuration's `discovery_timeout` plus the agent's DDL timeout
/// ([`agents::request_timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `rpcutil` requests (`discovery_timeout` + 2 s).
    pub rpcutil: Duration,
    /// `choria_provision` requests (`discovery_timeout` + 20 s).
    pub provision: Duration,
}

impl Timeouts {
    /// The timeouts for a Choria configuration's `discovery_timeout`.
    pub fn from_discovery_timeout(discovery_timeout: Duration) -> Self {
        Timeouts {
            rpcutil: agents::request_timeout(discovery_timeout, agents::RPCUTIL_DDL_TIMEOUT),
            provision: agents::request_timeout(discovery_timeout, agents::PROVISION_DDL_TIMEOUT),
        }
    }
}

/// The timeouts for go-choria's default `discovery_timeout` of 2 s: 4 s and 22 s.
impl Default for Timeouts {
    fn default() -> Self {
        Timeouts::from_discovery_timeout(DEFAULT_DISCOVERY_TIMEOUT)
    }
}

/// go-choria's default `discovery_timeout`.
const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);

/// [`NodeRpc`] over one shared [`RpcClient`].
#[derive(Clone)]
pub struct ChoriaNodeRpc {
    client: RpcClient,
    timeouts: Timeouts,
}

impl ChoriaNodeRpc {
    /// Wrap a connected client.
    pub fn new(client: RpcClient, timeouts: Timeouts) -> Self {
        ChoriaNodeRpc { client, timeouts }
    }
}

/// Map the client's error to the core's, keeping the identity and action.
fn map(identity: &str, action: Action, e: WireError) -> RpcError {
    // The core's error names the node and the action itself: keep only the cause here.
    let cause =
        || std::error::Error::source(&e).map_or_else(|| e.kind.to_string(), ToString::to_string);
    let kind = match &e.kind {
        WireKind::Timeout => RpcErrorKind::Timeout,
        WireKind::NoResponders => RpcErrorKind::NoResponders,
        WireKind::ProvisioningLocked => RpcErrorKind::LockHeld,
        WireKind::BadReply => RpcErrorKind::BadReply(cause()),
        WireKind::Transport | WireKind::NotConnected | WireKind::Closed => {
            RpcErrorKind::Transport(cause())
        }
        WireKind::Encode => RpcErrorKind::Transport(e.to_string()),
        WireKind::Status { code, message } => RpcErrorKind::Aborted {
            code: code.code(),
            message: message.clone(),
        },
    };
    RpcError::new(identity, action, kind)
}

impl NodeRpc for ChoriaNodeRpc {
    async fn inventory(&self, identity: &str) -> Result<Inventory, RpcError> {
        let inv = self
            .client
            .inventory(identity, self.timeouts.rpcutil)
            .await
            .map_err(|e| map(identity, Action::Inventory, e))?;
        // The helper receives the reply data as a JSON string with sorted keys, encoded as Go
        // encodes it.
        let json = provision_core::helper_protocol::to_go_json_string(&inv.raw).map_err(|e| {
            RpcError::new(
                identity,
                Action::Inventory,
                RpcErrorKind::BadReply(e.to_string()),
            )
        })?;
        Ok(Inventory {
            json,
            version: inv.version,
            upgradable: inv.upgradable,
        })
    }

    async fn jwt(&self, identity: &str, token: &str) -> Result<JwtReply, RpcError> {
        let r = self
            .client
            .provision_jwt(identity, token, self.timeouts.provision)
            .await
            .map_err(|e| map(identity, Action::Jwt, e))?;
        Ok(JwtReply {
            jwt: r.jwt,
            ecdh_public: r.ecdh_public,
        })
    }

    async fn gen25519(
        &self,
        identity: &str,
        token: &str,
        nonce: &str,
    ) -> Result<Ed25519Reply, RpcError> {
        let r = self
            .client
            .provision_gen25519(identity, token, nonce, self.timeouts.provision)
            .await
            .map_err(|e| map(identity, Action::Gen25519, e))?;
        Ok(Ed25519Reply {
            public_key: r.public_key,
            directory: r.directory,
            signature: r.signature,
        })
    }

    async fn gencsr(&self, identity: &str, token: &str, cn: &str) -> Result<CsrReply, RpcError> {
        let req = GencsrInput {
            cn: Some(cn.to_string()),
            ..Default::default()
        };
        let r = self
            .client
            .provision_gencsr(identity, token, &req, self.timeouts.provision)
            .await
            .map_err(|e| map(identity, Action::Gencsr, e))?;
        Ok(CsrReply {
            csr: r.csr,
            public_key: r.public_key,
            ssldir: r.ssldir,
        })
    }

    async fn configure(
        &self,
        identity: &str,
        request: &ConfigureRequest,
    ) -> Result<ActionMessage, RpcError> {
        // The Go provisioner sends every key, empty when unused.
        let wire = WireConfigure {
            config: request.config.clone(),
            certificate: Some(request.certificate.clone()),
            ca: Some(request.ca.clone()),
            ssldir: Some(request.ssldir.clone()),
            key: Some(request.key.clone()),
            ecdh_public: request.ecdh_public.clone(),
            action_policies: request.action_policies.clone(),
            opa_policies: request.opa_policies.clone(),
            server_jwt: request.server_jwt.clone(),
        };
        let r = self
            .client
            .provision_configure(identity, &request.token, &wire, self.timeouts.provision)
            .await
            .map_err(|e| map(identity, Action::Configure, e))?;
        Ok(ActionMessage { message: r.message })
    }

    async fn release_update(
        &self,
        identity: &str,
        token: &str,
        repository: &str,
        version: &str,
    ) -> Result<ActionMessage, RpcError> {
        let r = self
            .client
            .provision_release_update(
                identity,
                token,
                repository,
                version,
                self.timeouts.provision,
            )
            .await
            .map_err(|e| map(identity, Action::ReleaseUpdate, e))?;
        Ok(ActionMessage { message: r.message })
    }

    async fn restart(
        &self,
        identity: &str,
        token: &str,
        splay: u32,
    ) -> Result<ActionMessage, RpcError> {
        let r = self
            .client
            .provision_restart(identity, token, Some(splay), self.timeouts.provision)
            .await
            .map_err(|e| map(identity, Action::Restart, e))?;
        Ok(ActionMessage { message: r.message })
    }

    async fn shutdown(&self, identity: &str, token: &str) -> Result<ActionMessage, RpcError> {
        let r = self
            .client
            .provision_shutdown(identity, token, self.timeouts.provision)
            .await
            .map_err(|e| map(identity, Action::Shutdown, e))?;
        Ok(ActionMessage { message: r.message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_the_discovery_timeout_plus_the_ddl_timeout() {
        let t = Timeouts::default();
        assert_eq!(t.rpcutil, Duration::from_secs(4));
        assert_eq!(t.provision, Duration::from_secs(22));
        let t = Timeouts::from_discovery_timeout(Duration::from_secs(5));
        assert_eq!(t.rpcutil, Duration::from_secs(7));
        assert_eq!(t.provision, Duration::from_secs(25));
        let t = Timeouts::from_discovery_timeout(Duration::from_millis(1500));
        assert_eq!(t.rpcutil, Duration::from_millis(3500));
        assert_eq!(t.provision, Duration::from_millis(21500));
        let t = Timeouts::from_discovery_timeout(Duration::MAX);
        assert_eq!((t.rpcutil, t.provision), (Duration::MAX, Duration::MAX));
    }
}
