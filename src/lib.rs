//! tenxgraph: a durable runtime for Python agents. `engine` (the graph loop) and `store` (the
//! checkpointers) are free of Python types; `py` binds them to the `tenxgraph._core` module.
//! `metrics` and `failpoints` sit below both, so a store can count without knowing the engine.

pub mod engine;
pub mod failpoints;
pub mod metrics;
pub mod store;
mod py;
