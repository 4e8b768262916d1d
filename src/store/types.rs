use serde_json::Value;

/// Identifies a thread and the user acting on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ThreadRef {
    pub thread_id: String,
    pub user_id: String,
}

impl ThreadRef {
    pub fn new(thread_id: impl Into<String>, user_id: impl Into<String>) -> Self {
        Self { thread_id: thread_id.into(), user_id: user_id.into() }
    }
}

/// A message as persisted: its id and its full JSON (pydantic `model_dump(mode="json")`).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    pub id: String,
    pub data: Value,
}

/// What a run resumes from.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub version: i64,
    /// The state without its `context` (messages live in their own rows).
    pub state: Value,
    pub messages: Vec<Value>,
    /// The messages came from a state row written by 10xGraph (whole context inside the state):
    /// the next step must rewrite the thread's message rows from the live context.
    pub rewrite_messages: bool,
}

/// Called inside a step's transaction after its writes and before COMMIT (failpoints).
#[async_trait::async_trait]
pub trait TxHook: Send + Sync {
    async fn in_transaction(&self) -> Result<(), String>;
}

/// One durable step. Its size depends on the step, never on the thread's history, except when
/// `replace_messages` is set (a node rewrote earlier messages): then `new_messages` is the whole
/// context and replaces the stored list.
#[derive(Clone, Copy)]
pub struct StepWrite<'a> {
    pub expected_version: i64,
    pub state: &'a Value,
    pub new_messages: &'a [StoredMessage],
    pub replace_messages: bool,
    /// The run's lease token: the write is refused (`StoreError::Fenced`) once a newer holder
    /// exists. None for writes from outside a run.
    pub fence: Option<i64>,
    /// The run's last commit: free the lease (the one named by `fence`) in the same transaction,
    /// so a finished turn costs no extra round trip to hand the thread on.
    pub release_lease: bool,
    /// Only set while a failpoint is armed for this step.
    pub in_tx: Option<&'a dyn TxHook>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ThreadRow {
    pub thread_id: String,
    pub user_id: String,
    pub thread_name: Option<String>,
    pub meta: Value,
    pub created_at: f64,
    pub updated_at: f64,
}
