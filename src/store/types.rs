use serde_json::Value;

/// Identifies a thread and the user acting on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ThreadRef {
    /// The thread's id.
    pub thread_id: String,
    /// The user acting (the anonymous user's id when the config names none).
    pub user_id: String,
    /// The call carries a `config["authz"]` owner scope: the store treats it as it treats every
    /// call of a store that isolates users (another user's thread reads as absent, a write is
    /// refused). The caller's own owner check, made before the call, cannot see a thread that
    /// another user creates after it; the store's check runs in the write itself.
    pub owner_scoped: bool,
}

impl ThreadRef {
    /// The thread `thread_id` as seen by `user_id`.
    pub fn new(thread_id: impl Into<String>, user_id: impl Into<String>) -> Self {
        Self { thread_id: thread_id.into(), user_id: user_id.into(), owner_scoped: false }
    }

    /// The same thread and user, owner-scoped when `on` (see `owner_scoped`).
    pub fn scoped(mut self, on: bool) -> Self {
        self.owner_scoped = on;
        self
    }

    /// Whether this call is isolated from other users' threads on a store that isolates users
    /// when `store_isolates`.
    pub fn isolated(&self, store_isolates: bool) -> bool {
        store_isolates || self.owner_scoped
    }
}

/// A message as persisted: its id and its full JSON (pydantic `model_dump_json`), kept as the
/// text the host made: a step hands it to the store as it is, where decoding it into a `Value`
/// and encoding it again was most of the engine's own work per message.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// The message id; a thread's messages are upserted by it.
    pub id: String,
    /// The message as JSON text (checked to be one JSON value), stored and returned unchanged.
    pub data: RawJson,
}

impl StoredMessage {
    /// A message from a decoded document.
    pub fn new(id: impl Into<String>, data: &Value) -> Self {
        StoredMessage { id: id.into(), data: raw_json(data) }
    }

    /// A message from its text; an error when the text is not one JSON value.
    pub fn from_text(id: impl Into<String>, text: String) -> serde_json::Result<Self> {
        Ok(StoredMessage { id: id.into(), data: raw_json_from_text(text)? })
    }

    /// The document decoded (for the few readers that look inside it).
    pub fn value(&self) -> Value {
        decode_raw(&self.data)
    }
}

impl PartialEq for StoredMessage {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.data.get() == other.data.get()
    }
}

/// A stored text decoded. It was checked to be one JSON value when it was made, so this cannot
/// fail on a valid `RawJson`; `Null` stands in should it ever do.
pub fn decode_raw(raw: &serde_json::value::RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// A stored JSON document kept as its text: a thread's load hands each message's stored text on
/// to the host unchanged (checked to be one JSON value, never decoded into a `Value` and
/// re-encoded, which was most of the Rust side of a long thread's load).
pub type RawJson = Box<serde_json::value::RawValue>;

/// `v` as stored text.
pub fn raw_json(v: &Value) -> RawJson {
    // serde_json never fails on a Value.
    serde_json::value::to_raw_value(v).expect("a serde_json::Value always serialises")
}

/// The text of one stored document, checked to be a single JSON value (a corrupt row is an
/// error here, as a decode was before).
pub fn raw_json_from_text(text: String) -> serde_json::Result<RawJson> {
    serde_json::value::RawValue::from_string(text)
}

/// A JSON document as validated text, shared: a tool's result envelope goes from the host to the
/// ledger (the recorder's queue, the step commit that carries it, the memory store's map, a result
/// kept after a failed write) without being decoded into a `Value`, copied, or written out again.
/// Decoding it was the Rust core's largest cost per tool call; its ints past 64 bits came back
/// floats besides.
pub type SharedJson = std::sync::Arc<serde_json::value::RawValue>;

/// One ledger row as the stores write it: the ledger key and the recorded document.
pub type LedgerRow = (String, SharedJson);

/// `v` as shared text.
pub fn shared_json(v: &Value) -> SharedJson {
    raw_json(v).into()
}

/// A text checked to be one JSON value, shared.
pub fn shared_json_from_text(text: String) -> serde_json::Result<SharedJson> {
    Ok(raw_json_from_text(text)?.into())
}

/// What a run resumes from.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The version of the latest state row (the version a run's first step expects).
    pub version: i64,
    /// The state without its `context` (messages live in their own rows).
    pub state: Value,
    /// Every message of the thread, in order, as stored text (empty when `messages_known`).
    pub messages: Vec<RawJson>,
    /// The messages came from a state row written by 10xGraph (whole context inside the state):
    /// the next step must rewrite the thread's message rows from the live context.
    pub rewrite_messages: bool,
    /// The latest row is the one the caller named in `load_with` (`KnownHead`): `messages` is
    /// left empty because the caller still holds them.
    pub messages_known: bool,
}

impl Checkpoint {
    /// The messages decoded (for callers that inspect them; a run's load never does).
    pub fn message_values(&self) -> serde_json::Result<Vec<Value>> {
        self.messages.iter().map(|m| serde_json::from_str(m.get())).collect()
    }

    /// The last message decoded; None when there is none or it cannot be read.
    pub fn last_message(&self) -> Option<Value> {
        self.messages.last().and_then(|m| serde_json::from_str(m.get()).ok())
    }
}

/// Where in a state row the engine marks each commit (`state.__state_meta__.write`): a value
/// unique to that commit, so a process that still holds the live state of its own last run can
/// tell the row is unchanged without reading the thread's messages. The version alone is not
/// enough: a thread deleted and written again reaches the same versions.
pub const WRITE_MARK_PATH: [&str; 2] = [super::STATE_META_KEY, "write"];

/// `WRITE_MARK_PATH` as a SQLite JSON path (`$.__state_meta__.write`), bound into the statements
/// that read or clear the mark, so the key is spelled only in `STATE_META_KEY`.
pub fn write_mark_json_path() -> String {
    format!("$.{}.{}", WRITE_MARK_PATH[0], WRITE_MARK_PATH[1])
}

/// The write mark of a state row, if the engine committed it.
pub fn write_mark(state: &Value) -> Option<&str> {
    state.get(WRITE_MARK_PATH[0])?.get(WRITE_MARK_PATH[1])?.as_str()
}

/// Sets the write mark of a state row about to be committed.
pub fn set_write_mark(state: &mut Value, mark: &str) {
    let Some(obj) = state.as_object_mut() else { return };
    let meta = obj.entry(WRITE_MARK_PATH[0]).or_insert_with(|| Value::Object(Default::default()));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(WRITE_MARK_PATH[1].to_owned(), Value::String(mark.to_owned()));
    }
}

/// What a message write outside a step leaves as the latest row's mark: never a commit's mark, so
/// a process holding the live state of that commit loads the thread again, and a run in flight
/// (whose next commit names the mark it last saw, `StepWrite::previous_mark`) commits unmarked.
pub const MESSAGES_CHANGED: &str = "messages-changed";

/// Marks a state row as no longer describing its thread's messages (see `MESSAGES_CHANGED`).
pub fn mark_messages_changed(state: &mut Value) {
    set_write_mark(state, MESSAGES_CHANGED);
}

/// The state to store for a step: its mark is dropped when the thread's latest row no longer
/// carries the mark the run last saw (messages changed under the run, or another writer).
pub fn chained_state<'a>(w: &StepWrite<'a>, latest_mark: Option<&str>) -> std::borrow::Cow<'a, Value> {
    if write_mark(w.state).is_some() && latest_mark != w.previous_mark {
        let mut s = w.state.clone();
        if let Some(meta) = s.get_mut(WRITE_MARK_PATH[0]).and_then(Value::as_object_mut) {
            meta.remove(WRITE_MARK_PATH[1]);
        }
        std::borrow::Cow::Owned(s)
    } else {
        std::borrow::Cow::Borrowed(w.state)
    }
}

/// The commit a caller still holds the live state of: `load_with` skips the messages when the
/// thread's latest row is still this one.
#[derive(Debug, Clone, Copy)]
pub struct KnownHead<'a> {
    /// The version of the commit the caller holds.
    pub version: i64,
    /// That commit's write mark.
    pub mark: &'a str,
}

impl KnownHead<'_> {
    /// True when a row at `version` carrying `state` is the commit the caller holds.
    pub fn matches(&self, version: i64, state: &Value) -> bool {
        self.version == version && write_mark(state) == Some(self.mark)
    }
}

/// Called inside a step's transaction after its writes and before COMMIT (failpoints).
#[async_trait::async_trait]
pub trait TxHook: Send + Sync {
    /// Runs before COMMIT; an error rolls the step back and is returned as `StoreError::Failpoint`.
    async fn in_transaction(&self) -> Result<(), String>;
}

/// One durable step. Its size depends on the step, never on the thread's history, except when
/// `replace_messages` is set (a node rewrote earlier messages): then `new_messages` is the whole
/// context and replaces the stored list.
#[derive(Clone, Copy)]
pub struct StepWrite<'a> {
    /// The version the run read; the write fails with `StoreError::Stale` when the thread moved on.
    pub expected_version: i64,
    /// The new state, without its messages.
    pub state: &'a Value,
    /// The messages the step added (the whole context with `replace_messages`).
    pub new_messages: &'a [StoredMessage],
    /// Replace the thread's stored messages with `new_messages` instead of appending.
    pub replace_messages: bool,
    /// The run's lease token: the write is refused (`StoreError::Fenced`) once a newer holder
    /// exists. None for writes from outside a run.
    pub fence: Option<i64>,
    /// The run's last commit: free the lease (the one named by `fence`) in the same transaction,
    /// so a finished turn costs no extra round trip to hand the thread on.
    pub release_lease: bool,
    /// Only set while a failpoint is armed for this step.
    pub in_tx: Option<&'a dyn TxHook>,
    /// The write mark of the latest row as the run last saw it (loaded, or its own last commit).
    /// When the row no longer carries it, `state` is stored without its mark (`chained_state`).
    pub previous_mark: Option<&'a str>,
}

/// A thread row as `get_thread` and `list_threads` return it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadRow {
    /// The thread's id.
    pub thread_id: String,
    /// Its owner: the user who created it.
    pub user_id: String,
    /// The name given by `put_thread`, if any.
    pub thread_name: Option<String>,
    /// The metadata given by `put_thread` (`{}` when none).
    pub meta: Value,
    /// When the thread was created, seconds since the epoch.
    pub created_at: f64,
    /// When it was last written, seconds since the epoch.
    pub updated_at: f64,
}

/// What 10xGraph 0.10 left in its Redis state cache for a thread (`state_cache:<thread>:<user>`,
/// a JSON string: the whole state, context included, plus `__checkpoint_version__`). 10xGraph
/// writes it before each node starts, so for a run that died inside a node it is the only record
/// of the node in flight: its durable row names the last node that completed.
#[derive(Debug, Clone, PartialEq)]
pub enum LegacyCache {
    /// No such entry (or no Redis, or Redis down, or the entry is ours).
    Absent,
    /// An entry is there but cannot be read as a state (the reason, for the log).
    Unreadable(String),
    /// The decoded entry, as 10xGraph wrote it.
    Found(Value),
}
