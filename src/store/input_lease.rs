//! The first commit of a run: the thread's lease and the run's input in one transaction.
//!
//! The engine loads the thread without the lease (an optimistic read), prepares the input against
//! what it read, then asks the store to take the lease and write the input step against the loaded
//! version at once. A thread whose lease is live, or whose version moved since the read, is refused
//! with nothing written (no lease row moved, no state, no message); the engine then takes the lease
//! the usual way (its `on_busy` policy) and starts again from a fresh load.

use super::LeaseInfo;

/// What `Checkpointer::put_input_leased` did.
#[derive(Debug, Clone, PartialEq)]
pub enum LeasedInput {
    /// The lease is the run's (`token`) and the input step is committed at `version`, together.
    Committed {
        /// The run's fencing token.
        token: i64,
        /// The thread's version after the input step.
        version: i64,
    },
    /// Another holder's lease is live: nothing was written.
    Held(LeaseInfo),
}

/// The stop request the run's start clears: the namespace and key of the store's generic cache.
#[derive(Debug, Clone, Copy)]
pub struct StopKey<'a> {
    /// The cache namespace stop requests live in.
    pub namespace: &'a str,
    /// The run's key in it (thread and user).
    pub key: &'a str,
}
