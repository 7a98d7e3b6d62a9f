//! The provisioner's monitor listener and what it serves: `/metrics` (the
//! [`provisioner_metrics::Metrics`] exposition), `/healthz` and `/readyz` for scrapers and
//! supervisors, and for people the node history ([`nodes`]), the JSON status API ([`api`]) and
//! the status page ([`page`]), with fleet control's pause, deny count and approval queue
//! ([`control`]).
//!
//! The listener ([`serve_monitor`]) is hardened for a port anyone on the network may reach:
//! request-head, idle and age limits, a connection cap, accept errors backed off, and its tasks
//! tracked by [`Serving`] so a shutdown waits for them.

#![deny(missing_docs)]
pub mod api;
pub mod control;
mod http;
pub mod nodes;
pub mod page;
pub mod tls;

pub use api::Monitor;
pub use control::{CampaignInfo, ControlPanel, FleetControlView, PauseInfo, PendingInfo};
pub use http::{serve, serve_all, serve_monitor, ServeError, Serving};
pub use nodes::{HistoryLimits, NodeTable};
