//! Where a run that 10xGraph 0.10 left unfinished resumes.
//!
//! 10xGraph's durable row of a run under way names the last node that *completed* (it sets
//! `current_node` before a node runs but commits only after, and moves on to the next node in a
//! local variable), while ours names the node to run next. The node that was in flight when its
//! process died is recorded only in its Redis state cache (`state_cache:<thread>:<user>`), written
//! as each node starts. Taking the row as ours would run the completed node again: after a model
//! node that asked for tools, that is a model called on its own unanswered tool calls.
//!
//! So a row of 10xGraph's with status `running` resumes from its cache entry when one of the same
//! durable version is there (as 10xGraph itself would). Otherwise the row is routed on from where
//! running its node again cannot be right: a node whose last message holds tool calls, when the
//! graph routes from it to a tool node, resumes at that tool node (which answers from 10xGraph's
//! ledger the calls it had recorded); a tool node whose results are already the last messages
//! resumes wherever the graph routes from it (its run died in the next node, typically the model).
//! Any other row resumes at the node it names, as before.

use super::{ExecStatus, GraphSpec, START, graph::END};
use crate::store::{Checkpoint, Checkpointer, LegacyCache, StoreError, ThreadRef, legacy_log};
use serde_json::Value;

/// The field 10xGraph adds to its cache entry: the durable version the entry was cached at.
const CACHE_VERSION_KEY: &str = "__checkpoint_version__";

/// A thread whose latest durable row 10xGraph wrote while a run was under way (or, with
/// `durable_checkpoint_every_step=False`, one with no row at all yet). Only these can have been
/// left by 10xGraph mid-node; rows of ours never carry the context inside the state.
pub fn unfinished_legacy_run(stored: Option<&Checkpoint>) -> bool {
    match stored {
        None => true,
        Some(cp) => cp.rewrite_messages && status_of(&cp.state) == Some("running"),
    }
}

/// A thread whose latest durable row, if any, 10xGraph wrote: its Redis entry may hold a run the
/// row does not show. Besides a row that says `running`, a run started after the row was written
/// and killed before its next durable write (every run with `durable_checkpoint_every_step=False`)
/// leaves the row as it was, `completed`, paused or failed, and the run only in the entry, at
/// that row's version: a new turn, or a reviewer's go-on past a gate. 10xGraph resumes it from
/// there; so does a resume here, and a new turn is refused as for any run under way. Read only
/// for a row that says `running` (session 40), the turn was lost (`completed`), and a paused
/// row's approved run went back to its gate: the model asked again, and a tool that 10xGraph's
/// ledger had recorded fired a second time (red-teams, session 41).
pub fn may_have_legacy_cache(stored: Option<&Checkpoint>) -> bool {
    stored.is_none_or(|cp| cp.rewrite_messages)
}

fn status_of(state: &Value) -> Option<&str> {
    state.get("execution_meta")?.get("status")?.as_str()
}

/// What a run does when 10xGraph's entry could not be read (`err`: Redis down, or failed
/// moments ago): refuse (the error, a transient one: nothing was written yet) where the thread may
/// have a run 10xGraph left in the entry alone, else go on as without one.
/// - A row 10xGraph wrote (`has_row`): a run may be under way past it. Taken for "no entry",
///   `{}` went on from the row (the turn lost) and the turn sent again fired a tool 10xGraph's
///   ledger had recorded (red-team, session 41).
/// - No state row, but the thread's row: 10xGraph writes it with a run's first tool result (or
///   message write, or durable write), so this may be a first turn killed after a tool and before
///   its first durable write. With tools in its ledger, the turn sent
///   again, taken as a new thread's, fired a recorded `charge` again (red-team, session 42); a
///   `{}` has nothing to run from but the entry. Without them a new turn goes on: a thread named
///   (`aput_thread`) before its first message is one too, and Redis is a cache to it.
/// - A thread unknown here is a new one: a Redis outage must not stop new threads.
pub async fn unreadable_legacy_cache(
    store: &dyn Checkpointer,
    t: &ThreadRef,
    has_row: bool,
    resuming: bool,
    err: StoreError,
) -> Result<LegacyCache, StoreError> {
    if has_row || store.may_hold_legacy_run(t).await? {
        return Err(err);
    }
    if resuming && store.thread_owner(&t.thread_id).await?.is_some() {
        return Err(err);
    }
    tracing::warn!(
        thread_id = %t.thread_id,
        event = "legacy_cache_unreachable",
        "10xGraph's Redis state cache could not be read for a thread with no state row and no recorded tool; going on as a new thread: {err}"
    );
    Ok(LegacyCache::Absent)
}

/// Whether 10xGraph's cache entry found under this thread's key can be this thread's. Its key,
/// `state_cache:<thread>:<user>`, is not escaped: thread `T:b` of user `c` and thread `T` of user
/// `b:c` share one, and a run 10xGraph left unfinished for one was resumed under the other's new
/// thread (its messages handed over, its tools fired again; red-team, session 34). The entry's
/// `execution_meta.thread_id` (10xGraph sets it on every run) names its thread; once the thread is
/// known the user part of the key is too. An entry without it is taken only where no ':' makes
/// the key ambiguous.
pub fn cache_entry_is_this_threads(cache: &LegacyCache, t: &ThreadRef) -> bool {
    let LegacyCache::Found(entry) = cache else { return true };
    match entry.get("execution_meta").and_then(|m| m.get("thread_id")) {
        Some(Value::String(id)) => *id == t.thread_id,
        Some(Value::Number(n)) => n.to_string() == t.thread_id,
        _ => !(t.thread_id.contains(':') || t.user_id.contains(':')),
    }
}

/// The checkpoint to resume from, built from 10xGraph's cache entry, or why the entry is not used
/// (for the log; `Ok(None)`: there is no entry to speak of).
pub fn from_cache(
    graph: &GraphSpec,
    stored: Option<&Checkpoint>,
    cache: LegacyCache,
) -> Result<Option<Checkpoint>, String> {
    let mut entry = match cache {
        LegacyCache::Absent => return Ok(None),
        LegacyCache::Unreadable(why) => return Err(why),
        LegacyCache::Found(v) => v,
    };
    let Some(obj) = entry.as_object_mut() else { return Err("not a JSON object".into()) };
    let cached_version = match obj.remove(CACHE_VERSION_KEY) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())) {
            Some(n) => Some(n),
            None => return Err(format!("{CACHE_VERSION_KEY} is not a version number: {v}")),
        },
    };
    let durable_version = stored.map(|c| c.version);
    // A row that shows no run under way names none in flight, so an entry that shows none at its
    // version (the row's own, cached as 10xGraph committed it) or an entry of another version is
    // no sign of one either: nothing to say.
    let row_shows_run = unfinished_legacy_run(stored);
    let entry_shows_run =
        obj.get("execution_meta").and_then(|m| m.get("status")).and_then(Value::as_str) == Some("running");
    if !row_shows_run && (cached_version != durable_version || !entry_shows_run) {
        return Ok(None);
    }
    // The entry must describe the durable row the thread is at: an older entry (cached before a
    // later durable write) or one of a thread written since by someone else is not this run.
    // With no row yet, 10xGraph cached without a version.
    if cached_version != durable_version {
        return Err(format!(
            "it was cached at version {} but the thread's latest row is version {}",
            cached_version.map_or("none".into(), |v| v.to_string()),
            durable_version.map_or("none".into(), |v| v.to_string()),
        ));
    }
    let messages = match obj.remove("context") {
        Some(Value::Array(ctx)) => ctx,
        Some(_) => return Err("its context is not a list of messages".into()),
        None => return Err("it has no context".into()),
    };
    let meta = obj.get("execution_meta").and_then(Value::as_object).ok_or("it has no execution_meta")?;
    if !entry_shows_run {
        return Err("its run is not under way".into());
    }
    let node = meta.get("current_node").and_then(Value::as_str).ok_or("its execution_meta names no current_node")?;
    if !graph.has_node(node) {
        return Err(format!("it names node '{node}', which is not a node of this graph"));
    }
    // The entry's context goes into the thread's messages as the row's does (`legacy_log`): the
    // durable row's were merged with 10xGraph's log when loaded, and a context the entry trimmed
    // again drops none of them.
    let logged = stored.map(|c| c.messages.iter().map(|m| (legacy_log::logged_id(m), m.clone())).collect());
    Ok(Some(Checkpoint {
        version: durable_version.unwrap_or(0),
        state: entry,
        messages: legacy_log::merged(&messages, logged.unwrap_or_default()),
        // The first commit writes the thread's message rows from these.
        rewrite_messages: true,
        messages_known: false,
    }))
}

/// Whether the resumed state's last message asks for tools that nothing has answered yet (a
/// tool node's results come after the message that asked).
pub fn awaits_tool_results(messages: &[Value]) -> bool {
    messages.last().and_then(|m| m.get("tools_calls")).and_then(Value::as_array).is_some_and(|calls| !calls.is_empty())
}

/// Where routing on from the completed node named by 10xGraph's row may lead for the resume to
/// take it (see the module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOn {
    /// The node asked for tools: only a tool node is the node that was in flight.
    ToToolNode,
    /// A tool node whose results are in: wherever the graph goes next.
    Anywhere,
}

impl RouteOn {
    /// Whether routing from the completed node to `next` is a resume this rule allows.
    pub fn accepts(self, graph: &GraphSpec, next: &str) -> bool {
        match self {
            RouteOn::ToToolNode => is_tool_node(graph, next),
            RouteOn::Anywhere => next == END || graph.has_node(next) && next != START,
        }
    }
}

fn is_tool_node(graph: &GraphSpec, node: &str) -> bool {
    graph.tool_nodes.iter().any(|n| n == node)
}

/// Whether (and how) to route on from `node`, the completed node 10xGraph's row of a run under
/// way names, given the resumed state's messages. None: resume at `node` itself.
pub fn route_on_from(graph: &GraphSpec, node: &str, status: ExecStatus, messages: &[Value]) -> Option<RouteOn> {
    if status != ExecStatus::Running || node == START || node == END || !graph.has_node(node) {
        return None;
    }
    match (is_tool_node(graph, node), awaits_tool_results(messages)) {
        (false, true) => Some(RouteOn::ToToolNode),
        // A tool node acts on the last message's tool calls: with none there, running it again
        // can only fail (NODE_002); its run went on to the next node.
        (true, false) if messages.last().is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("tool")) => {
            Some(RouteOn::Anywhere)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn graph() -> GraphSpec {
        GraphSpec {
            nodes: vec!["model".into(), "tools".into()],
            edges: vec![],
            entry: Some("model".into()),
            tool_nodes: vec!["tools".into()],
            ..Default::default()
        }
    }

    fn row(version: i64) -> Checkpoint {
        Checkpoint {
            version,
            state: json!({"execution_meta": {"current_node": "model", "status": "running"}}),
            messages: vec![
                crate::store::raw_json(&json!({"message_id": "u0", "role": "user"})),
                crate::store::raw_json(&json!({"message_id": "u1", "role": "user"})),
            ],
            rewrite_messages: true,
            messages_known: false,
        }
    }

    fn entry(version: Value, node: &str, status: &str) -> LegacyCache {
        LegacyCache::Found(json!({
            "context": [{"message_id": "u1", "role": "user"}, {"message_id": "a1", "role": "assistant", "tools_calls": [{"id": "c1"}]}],
            "execution_meta": {"current_node": node, "status": status, "step": 2},
            "__checkpoint_version__": version,
        }))
    }

    #[test]
    fn an_entry_of_the_same_version_is_resumed_from() {
        let cp = from_cache(&graph(), Some(&row(2)), entry(json!(2), "tools", "running")).unwrap().unwrap();
        assert_eq!(cp.version, 2);
        assert_eq!(cp.state["execution_meta"]["current_node"], "tools");
        assert!(cp.state.get("__checkpoint_version__").is_none() && cp.state.get("context").is_none());
        // The entry's context (trimmed to u1 by a context manager) merged into the row's
        // messages: u0, which only the row and 10xGraph's log hold, is kept.
        let ids: Vec<_> = cp.messages.iter().map(|m| legacy_log::logged_id(m).unwrap()).collect();
        assert_eq!(ids, ["u0", "u1", "a1"]);
        assert!(cp.rewrite_messages);
    }

    #[test]
    fn entries_that_do_not_describe_the_row_are_refused() {
        let g = graph();
        assert!(from_cache(&g, Some(&row(3)), entry(json!(2), "tools", "running")).is_err());
        assert!(from_cache(&g, Some(&row(2)), entry(Value::Null, "tools", "running")).is_err());
        assert!(from_cache(&g, Some(&row(2)), entry(json!("x"), "tools", "running")).is_err());
        assert!(from_cache(&g, Some(&row(2)), entry(json!(2), "gone", "running")).is_err());
        assert!(from_cache(&g, Some(&row(2)), entry(json!(2), "tools", "completed")).is_err());
        assert!(from_cache(&g, Some(&row(2)), LegacyCache::Unreadable("not JSON".into())).is_err());
        assert!(from_cache(&g, Some(&row(2)), LegacyCache::Found(json!({"execution_meta": {}}))).is_err());
        assert!(matches!(from_cache(&g, Some(&row(2)), LegacyCache::Absent), Ok(None)));
    }

    #[test]
    fn a_finished_or_paused_rows_entry_is_resumed_from_only_when_it_shows_a_run_at_the_rows_version() {
        let g = graph();
        let mut done = row(2);
        done.state = json!({"execution_meta": {"current_node": "__end__", "status": "completed"}});
        assert!(!unfinished_legacy_run(Some(&done)) && may_have_legacy_cache(Some(&done)));
        let cp = from_cache(&g, Some(&done), entry(json!(2), "tools", "running")).unwrap().unwrap();
        assert_eq!((cp.version, cp.state["execution_meta"]["current_node"].as_str()), (2, Some("tools")));
        // The finished turn's own entry, or one of another version: quietly nothing.
        assert!(matches!(from_cache(&g, Some(&done), entry(json!(2), "__end__", "completed")), Ok(None)));
        assert!(matches!(from_cache(&g, Some(&done), entry(json!(1), "tools", "running")), Ok(None)));
        assert!(matches!(from_cache(&g, Some(&done), entry(json!(3), "tools", "running")), Ok(None)));
        // A paused row whose approved run 10xGraph left in the entry: the same. A row of ours
        // never has 10xGraph's entry read.
        let mut paused = done.clone();
        paused.state["execution_meta"]["status"] = json!("interrupted_before");
        assert!(may_have_legacy_cache(Some(&paused)));
        assert!(from_cache(&g, Some(&paused), entry(json!(2), "tools", "running")).unwrap().is_some());
        assert!(matches!(from_cache(&g, Some(&paused), entry(json!(2), "model", "interrupted_before")), Ok(None)));
        done.rewrite_messages = false;
        assert!(!may_have_legacy_cache(Some(&done)));
    }

    #[test]
    fn without_a_row_only_an_unversioned_entry_counts() {
        let g = graph();
        assert_eq!(from_cache(&g, None, entry(Value::Null, "tools", "running")).unwrap().unwrap().version, 0);
        assert!(from_cache(&g, None, entry(json!(1), "tools", "running")).is_err());
    }

    #[test]
    fn routing_on_is_chosen_only_where_running_the_node_again_cannot_be_right() {
        let g = graph();
        let asked = [json!({"role": "user"}), json!({"role": "assistant", "tools_calls": [{"id": "c1"}]})];
        let answered = [asked[0].clone(), asked[1].clone(), json!({"role": "tool"})];
        let running = ExecStatus::Running;
        assert_eq!(route_on_from(&g, "model", running, &asked), Some(RouteOn::ToToolNode));
        assert_eq!(route_on_from(&g, "tools", running, &answered), Some(RouteOn::Anywhere));
        assert_eq!(route_on_from(&g, "tools", running, &asked), None, "its calls are not answered: it runs");
        assert_eq!(route_on_from(&g, "model", running, &answered), None, "the model runs on the results");
        assert_eq!(route_on_from(&g, "model", ExecStatus::Error, &asked), None);
        assert_eq!(route_on_from(&g, "gone", running, &asked), None);
        assert_eq!(route_on_from(&g, START, running, &asked), None);
        assert!(RouteOn::ToToolNode.accepts(&g, "tools") && !RouteOn::ToToolNode.accepts(&g, "model"));
        assert!(!RouteOn::ToToolNode.accepts(&g, END));
        assert!(RouteOn::Anywhere.accepts(&g, "model") && RouteOn::Anywhere.accepts(&g, END));
        assert!(!RouteOn::Anywhere.accepts(&g, START) && !RouteOn::Anywhere.accepts(&g, "gone"));
    }

    #[test]
    fn only_a_last_message_with_tool_calls_awaits_results() {
        assert!(awaits_tool_results(&[json!({"role": "assistant", "tools_calls": [{"id": "c1"}]})]));
        assert!(!awaits_tool_results(&[
            json!({"role": "assistant", "tools_calls": [{"id": "c1"}]}),
            json!({"role": "tool"})
        ]));
        assert!(!awaits_tool_results(&[json!({"role": "assistant", "tools_calls": []})]));
        assert!(!awaits_tool_results(&[]));
    }
}
