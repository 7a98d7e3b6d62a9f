//! The object-safe forms of [`NodeRpc`] and [`Helper`]: an embedder implements the traits with
//! `async fn`, and the [`crate::Provisioner`] holds them as trait objects through these, so one
//! provisioner type serves every transport and helper. One boxed future per call.

use std::future::Future;
use std::pin::Pin;

use helper_protocol::{CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply};

use crate::rpc::{ActionMessage, ConfigureRequest, Helper, Inventory, JwtReply, NodeRpc, RpcError};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(crate) trait DynNodeRpc: Send + Sync + 'static {
    fn inventory<'a>(&'a self, identity: &'a str) -> BoxFuture<'a, Result<Inventory, RpcError>>;
    fn jwt<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<JwtReply, RpcError>>;
    fn gen25519<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        nonce: &'a str,
    ) -> BoxFuture<'a, Result<Ed25519Reply, RpcError>>;
    fn gencsr<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        cn: &'a str,
    ) -> BoxFuture<'a, Result<CsrReply, RpcError>>;
    fn configure<'a>(
        &'a self,
        identity: &'a str,
        request: &'a ConfigureRequest,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>>;
    fn release_update<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        repository: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>>;
    fn restart<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        splay: u32,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>>;
    fn shutdown<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>>;
}

impl<T: NodeRpc> DynNodeRpc for T {
    fn inventory<'a>(&'a self, identity: &'a str) -> BoxFuture<'a, Result<Inventory, RpcError>> {
        Box::pin(NodeRpc::inventory(self, identity))
    }
    fn jwt<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<JwtReply, RpcError>> {
        Box::pin(NodeRpc::jwt(self, identity, token))
    }
    fn gen25519<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        nonce: &'a str,
    ) -> BoxFuture<'a, Result<Ed25519Reply, RpcError>> {
        Box::pin(NodeRpc::gen25519(self, identity, token, nonce))
    }
    fn gencsr<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        cn: &'a str,
    ) -> BoxFuture<'a, Result<CsrReply, RpcError>> {
        Box::pin(NodeRpc::gencsr(self, identity, token, cn))
    }
    fn configure<'a>(
        &'a self,
        identity: &'a str,
        request: &'a ConfigureRequest,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>> {
        Box::pin(NodeRpc::configure(self, identity, request))
    }
    fn release_update<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        repository: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>> {
        Box::pin(NodeRpc::release_update(
            self, identity, token, repository, version,
        ))
    }
    fn restart<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
        splay: u32,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>> {
        Box::pin(NodeRpc::restart(self, identity, token, splay))
    }
    fn shutdown<'a>(
        &'a self,
        identity: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<ActionMessage, RpcError>> {
        Box::pin(NodeRpc::shutdown(self, identity, token))
    }
}

pub(crate) trait DynHelper: Send + Sync + 'static {
    fn run<'a>(&'a self, input: &'a HelperInput)
        -> BoxFuture<'a, Result<HelperReply, HelperError>>;
}

impl<T: Helper> DynHelper for T {
    fn run<'a>(
        &'a self,
        input: &'a HelperInput,
    ) -> BoxFuture<'a, Result<HelperReply, HelperError>> {
        Box::pin(Helper::run(self, input))
    }
}
