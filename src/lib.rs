//! tenxgraph: a durable runtime for Python agents. `engine` (the graph loop) and `store` (the
//! checkpointers) are free of Python types; `py` binds them to the `tenxgraph._core` module.

pub mod engine;
pub mod failpoints;
pub mod store;
mod py;
