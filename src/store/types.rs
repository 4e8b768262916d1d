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

/// A mark no other write has: a per-process random prefix and a counter (no syscall per commit).
pub fn unique_mark() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string());
    format!("{prefix}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// How the mark a message write outside a step leaves on the latest row begins. The mark is never
/// a commit's, so a process holding the live state of that commit loads the thread again, and a
/// run in flight (whose next commit names the mark it last saw, `StepWrite::previous_mark`)
/// commits unmarked. It is unique to the write, so a caller that read the state before it can
/// tell (`StepWrite::expected_mark`): one constant let a versioned `aput_state` drop a message
/// written after its read (session 40).
pub const MESSAGES_CHANGED: &str = "messages-changed";

/// A new mark for a message write outside a step (see `MESSAGES_CHANGED`).
pub fn messages_changed_mark() -> String {
    format!("{MESSAGES_CHANGED}-{}", unique_mark())
}

/// What a message write outside a step knows of its caller's read: the mark the caller read on
/// the latest row (`seen`, "" for a row without one) and a new mark of its own (`mark`:
/// `MESSAGES_CHANGED`, a dash and a unique suffix; the host makes it, so it knows it). While the latest row still carries `seen`, the write leaves `mark`,
/// so the caller's own later versioned write (which names `mark`) goes through; otherwise another
/// write came between, and it leaves a mark no caller holds. Without it, one caller's
/// `aput_messages` then `aput_state` (10xGraph's way of keeping its state and message log in
/// step) was refused every time.
#[derive(Debug, Clone)]
pub struct ChangeMark {
    /// The mark of the row the caller read.
    pub seen: String,
    /// The mark to leave when the latest row still carries `seen`.
    pub mark: String,
}

/// The mark a message write outside a step leaves on a latest row whose mark is `latest`.
pub fn changed_mark(after: Option<&ChangeMark>, latest: Option<&str>) -> String {
    match after {
        Some(c) if latest.unwrap_or("") == c.seen => c.mark.clone(),
        _ => messages_changed_mark(),
    }
}

/// Refuses a step whose read no longer describes the thread, given the latest row's version
/// (`current`, 0 for none) and mark (`latest`, None for a row without one): `Stale` when another
/// step came between, `StaleMessages` when a write from outside a run names a mark
/// (`w.expected_mark`) that messages written or deleted since have moved.
pub fn check_head(
    w: &StepWrite<'_>,
    t: &super::ThreadRef,
    current: i64,
    latest: Option<&str>,
) -> Result<(), super::StoreError> {
    let thread_id = || t.thread_id.clone();
    if current != w.expected_version {
        return Err(super::StoreError::Stale { thread_id: thread_id(), expected: w.expected_version, current });
    }
    match w.expected_mark {
        Some(m) if m != latest.unwrap_or("") => {
            Err(super::StoreError::StaleMessages { thread_id: thread_id(), version: w.expected_version })
        }
        _ => Ok(()),
    }
}

/// The state to store for a step, and the mark it carries: its mark is dropped when the thread's
/// latest row no longer carries the mark the run last saw (messages changed under the run, or
/// another writer). That is the rare path; it decodes the text.
pub fn chained_state<'a>(w: &StepWrite<'a>, latest_mark: Option<&str>) -> (SharedJson, Option<&'a str>) {
    if w.mark.is_some() && latest_mark != w.previous_mark {
        (state_without_mark(w.state), None)
    } else {
        (w.state.clone(), w.mark)
    }
}

/// A state row given as a `Value` (a write from outside a run, a store re-hydrated from Python):
/// its text and the write mark inside it, as `StepWrite` takes them.
pub fn state_row(state: &Value) -> (SharedJson, Option<String>) {
    (shared_json(state), write_mark(state).map(str::to_owned))
}

/// `state` without its write mark.
pub fn state_without_mark(state: &SharedJson) -> SharedJson {
    let Ok(mut v) = serde_json::from_str::<Value>(state.get()) else { return state.clone() };
    if let Some(meta) = v.get_mut(WRITE_MARK_PATH[0]).and_then(Value::as_object_mut) {
        meta.remove(WRITE_MARK_PATH[1]);
    }
    shared_json(&v)
}

/// A state row's text with `mark` as its write mark. The host's text ends with the state's
/// header (`{..., "__state_meta__": {"format": 1, "class": "..."}}`): the mark goes in before
/// its two closing braces, with no decoding. Any other text (no header last, a header holding
/// braces or a mark already) is decoded and written again.
pub fn marked_state(mut text: String, mark: &str) -> Result<SharedJson, String> {
    // What a decode refused and the raw text lets through: a load decodes the row, and a row
    // no load can read wedged its thread on every backend.
    loadable_text(&text)?;
    let key = format!("\"{}\"", super::STATE_META_KEY);
    let spliceable = text.rfind(&key).is_some_and(|at| {
        let rest = &text[at + key.len()..];
        rest.ends_with("}}")
            && rest.matches('{').count() == 1
            && rest.matches('}').count() == 2
            && !rest.contains(&format!("\"{}\"", WRITE_MARK_PATH[1]))
            && !rest.contains('\\')
    });
    if spliceable {
        let body_end = text.len() - 2;
        let empty_meta = text[..body_end].trim_end().ends_with('{');
        text.truncate(body_end);
        text.push_str(if empty_meta { "\"" } else { ",\"" });
        text.push_str(WRITE_MARK_PATH[1]);
        text.push_str("\":");
        text.push_str(&serde_json::to_string(mark).map_err(|e| e.to_string())?);
        text.push_str("}}");
        return shared_json_from_text(text).map_err(|e| e.to_string());
    }
    let mut v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    set_write_mark(&mut v, mark);
    Ok(shared_json(&v))
}

/// The deepest nesting serde_json decodes (its limit of 128 counts the value that would be
/// refused): every load of a state row decodes it.
const LOAD_DEPTH: usize = 127;

/// Refuses a JSON text a decode would refuse where validating it as raw text does not: nesting
/// past `LOAD_DEPTH`, and a `\u` escape that is a lone surrogate. One pass over the bytes,
/// no allocation; the syntax itself is left to the parser.
pub fn loadable_text(text: &str) -> Result<(), String> {
    let b = text.as_bytes();
    let (mut depth, mut i, mut in_string) = (0usize, 0usize, false);
    while i < b.len() {
        match (in_string, b[i]) {
            (false, b'"') | (true, b'"') => in_string = !in_string,
            (false, b'{' | b'[') => {
                depth += 1;
                if depth > LOAD_DEPTH {
                    return Err(format!("nested more than {LOAD_DEPTH} levels deep, which no load can read"));
                }
            }
            (false, b'}' | b']') => depth = depth.saturating_sub(1),
            (true, b'\\') => {
                let (lone, len) = escape_at(b, i);
                if lone {
                    return Err("a lone surrogate (\\u escape) in a string, which no load can read".into());
                }
                i += len;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The escape whose `\` is `b[i]`: whether it is a `\u` escape of a lone UTF-16 surrogate, and its
/// length in bytes (12 for a surrogate pair, 6 for another `\u` escape, else 2).
fn escape_at(b: &[u8], i: usize) -> (bool, usize) {
    let unit = |at: usize| -> Option<u32> {
        let esc = b.get(at..at + 6)?;
        if &esc[..2] != b"\\u" {
            return None;
        }
        u32::from_str_radix(std::str::from_utf8(&esc[2..]).ok()?, 16).ok()
    };
    match unit(i) {
        Some(0xD800..=0xDBFF) if matches!(unit(i + 6), Some(0xDC00..=0xDFFF)) => (false, 12),
        Some(0xD800..=0xDFFF) => (true, 6),
        _ if b.get(i + 1) == Some(&b'u') => (false, 6),
        _ => (false, 2),
    }
}

/// `text` with each `\uXXXX` escape of a lone UTF-16 surrogate read as `\ufffd`, or None when it
/// has none (the escapes `loadable_text` refuses). Python's `json.dumps` writes a lone surrogate of
/// a str that holds one (a client that cut an emoji in half), and serde_json does not read it: a
/// 10xGraph run whose Redis entry held one was invisible to recovery (red-team, session 45).
/// Escaped backslashes are skipped, so `\\ud800` (a backslash, then text) is kept.
pub fn lone_surrogates_replaced(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let (mut out, mut copied, mut i) = (String::new(), 0, 0);
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        let (lone, len) = escape_at(b, i);
        if lone {
            out.push_str(&text[copied..i]);
            out.push_str("\\ufffd");
            copied = i + len;
        }
        i += len;
    }
    (copied > 0).then(|| {
        out.push_str(&text[copied..]);
        out
    })
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
        self.matches_mark(version, write_mark(state))
    }

    /// True when a row at `version` whose write mark is `mark` is the commit the caller holds.
    pub fn matches_mark(&self, version: i64, mark: Option<&str>) -> bool {
        self.version == version && mark == Some(self.mark)
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
    /// The new state, without its messages, as the host wrote it (with `mark` inside).
    pub state: &'a SharedJson,
    /// The write mark inside `state` (`WRITE_MARK_PATH`), if it has one: the stores record it
    /// without reading the text again.
    pub mark: Option<&'a str>,
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
    /// For a write from outside a run that read the thread first (`aget_state`, then a versioned
    /// `aput_state`): the write mark of the row it read ("" for a row without one). The write is
    /// refused (`StoreError::StaleMessages`) when the latest row carries another: messages were
    /// written or deleted outside a step since the read, which makes no new version. None: no
    /// check (runs, and writes that name no read).
    pub expected_mark: Option<&'a str>,
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

#[cfg(test)]
mod tests {
    use super::{lone_surrogates_replaced, marked_state, write_mark};
    use serde_json::{Value, json};

    fn marked(text: &str) -> Value {
        serde_json::from_str(marked_state(text.to_owned(), "m-1").unwrap().get()).unwrap()
    }

    #[test]
    fn the_mark_goes_into_the_header_and_nothing_else_changes() {
        let text = r#"{"n":1,"big":18446744073709551615,"s":"}}","__state_meta__": {"format": 1, "class": "A"}}"#;
        let out = marked_state(text.to_owned(), "m-1").unwrap();
        // Spliced, not written again: the number past 64 bits keeps its digits.
        assert!(out.get().contains("18446744073709551615"), "{}", out.get());
        let v: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(write_mark(&v), Some("m-1"));
        assert_eq!(v["__state_meta__"]["class"], "A");
        assert_eq!(v["s"], "}}");
    }

    #[test]
    fn any_other_text_is_marked_through_a_decode() {
        // No header; an empty header; a header already marked; the key nested in the last field.
        assert_eq!(marked(r#"{"a":1}"#), json!({"a": 1, "__state_meta__": {"write": "m-1"}}));
        assert_eq!(marked(r#"{"__state_meta__":{}}"#), json!({"__state_meta__": {"write": "m-1"}}));
        assert_eq!(
            marked(r#"{"__state_meta__":{"class":"A","write":"old"}}"#),
            json!({"__state_meta__": {"class": "A", "write": "m-1"}})
        );
        assert_eq!(
            marked(r#"{"x":{"__state_meta__":{"k":1}}}"#),
            json!({"x": {"__state_meta__": {"k": 1}}, "__state_meta__": {"write": "m-1"}})
        );
        assert!(marked_state("[1]}}".to_owned(), "m").is_err());
    }

    #[test]
    fn lone_surrogate_escapes_are_read_as_the_replacement_character() {
        assert_eq!(lone_surrogates_replaced(r#"{"t": "cut \ud83d"}"#).as_deref(), Some(r#"{"t": "cut \ufffd"}"#));
        assert_eq!(lone_surrogates_replaced(r#"["\udc00\ud83d", "x"]"#).as_deref(), Some(r#"["\ufffd\ufffd", "x"]"#));
        // A pair, an escaped backslash before text, and a pair cut at the end are told apart.
        assert_eq!(lone_surrogates_replaced(r#"["\ud83d\ude00", "\\ud800"]"#), None);
        assert_eq!(lone_surrogates_replaced(r#"["\\\ud800"]"#).as_deref(), Some(r#"["\\\ufffd"]"#));
        assert_eq!(lone_surrogates_replaced(r#""\ud83d"#).as_deref(), Some(r#""\ufffd"#));
        for text in [r#"{"t": "cut \ud83d"}"#, r#"["\\\ud800", "\ud83d\ude00"]"#] {
            let fixed = lone_surrogates_replaced(text).unwrap();
            assert!(serde_json::from_str::<Value>(text).is_err());
            assert!(serde_json::from_str::<Value>(&fixed).is_ok(), "{fixed}");
        }
    }
    #[test]
    fn a_text_no_load_could_read_is_refused() {
        let deep = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        let first_refused = (100..200).find(|&n| serde_json::from_str::<Value>(&deep(n)).is_err()).unwrap();
        assert!(marked_state(deep(first_refused - 1), "m").is_ok(), "{first_refused}");
        assert!(marked_state(deep(first_refused), "m").unwrap_err().contains("nested"), "{first_refused}");
        for lone in [r#"{"s":"a\ud800b"}"#, r#"{"s":"\udc00"}"#, r#"{"s":"\ud800\u0041"}"#, r#"{"s":"\ud800"}"#] {
            assert!(marked_state(lone.to_owned(), "m").unwrap_err().contains("surrogate"), "{lone}");
            assert!(serde_json::from_str::<Value>(lone).is_err(), "{lone}");
        }
        // A pair, escaped backslashes and brackets inside strings are fine.
        for ok in [r#"{"s":"\ud83d\ude00"}"#, r#"{"s":"\\ud800"}"#, r#"{"s":"[[[{{{\""}"#] {
            assert!(marked_state(ok.to_owned(), "m").is_ok(), "{ok}");
            assert!(serde_json::from_str::<Value>(ok).is_ok(), "{ok}");
        }
    }
}
