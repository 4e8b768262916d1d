//! The graph loop. No Python types: nodes, conditions and the live state are reached through the
//! `NodeHost` trait, so the loop is tested with Rust closures and a real store.

#![warn(missing_docs)]

/// Run settings and their defaults: the one place each default is written (Python asks `_core`).
pub mod config;
mod error;
mod exec;
mod graph;
mod host;
mod lease;
pub mod ledger;
mod legacy_resume;
mod recovery;
mod routing;
mod run_loop;
mod stop;
mod tools;
mod unstarted;

pub use crate::metrics::{Metrics, metrics};
pub use config::{RunConfig, resolve_timeout};
pub use error::{BoxError, EngineError};
pub use exec::{ExecMeta, ExecStatus};
pub use graph::{END, EdgeSpec, GraphSpec, START};
pub use host::{HostFailure, Lifecycle, MsgCursor, NodeHost, NodeOutput, RouteValue, Snapshot, Stored};
pub use lease::{LeasePolicy, OnBusy};
pub use ledger::{idempotency_key, is_valid_envelope, ledger_key};
pub use recovery::{RecoveryCandidate, recovery_candidates};
pub use routing::next_node;
pub use run_loop::{RunInput, RunOutcome, release_abandoned, run, run_shared};
pub use stop::{STOP_NAMESPACE, StopSignals, stop_key};
pub use tools::{
    Carried, CarriedRow, SideEffects, ToolBatch, ToolCall, ToolNotStarted, ToolOutcome, ToolRun, UnknownAnswer,
    record_kept, run_tool_node, spawn_kept_recorder,
};
