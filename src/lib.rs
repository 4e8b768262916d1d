//! tenxgraph: a durable runtime for Python agents. `engine` (the graph loop) and `store` (the
//! checkpointers) are free of Python types; `py` binds them to the `tenxgraph._core` module.
//! `metrics` and `failpoints` sit below both, so a store can count without knowing the engine.

// The engine's and the binding's errors carry a whole PyErr or a typed context (a boxed one would
// be one more allocation on every refused call, for no caller that moves them around in bulk).
#![allow(clippy::result_large_err)]

pub mod engine;
pub mod failpoints;
pub mod metrics;
mod py;
pub mod store;
