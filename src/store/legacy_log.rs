//! A thread 10xGraph 0.10 wrote last (PostgreSQL): its state row holds the context the nodes saw, and its
//! `messages` table is a log that only grows (a context manager, `trim_context`, a summary, or a
//! node trimming the state shortened the context, never the log). Ours keeps one list, and the
//! thread's next commit writes that list in our form. Taken from the context alone, that commit
//! deleted every logged message the context had dropped: a chat's earlier turns, its tool calls
//! and results, and a message `aput_messages` added before the commit (red-team, session 40;
//! 10xGraph keeps them all). So the thread's messages are the log with the context merged in.

use crate::store::{RawJson, raw_json};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// A message's id as the tables key it (a number as its decimal text).
fn id_of(v: &Value) -> Option<String> {
    let id = v.get("message_id")?;
    match id {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The log (`log`, the table's rows in its order, with their ids) with the context (`ctx`, in
/// the order the nodes saw it) merged in: each context message takes the place of its log row, in the
/// context's own order (the log orders rows of one transaction by their random ids); a context
/// message the log lacks (10xGraph's `aput_state` writes no log rows) comes after the context
/// message before it, or first; a log row the context lacks stays where the log has it.
pub fn merged(ctx: &[Value], log: Vec<(Option<String>, RawJson)>) -> Vec<RawJson> {
    merged_keeping_edits(ctx, log, &HashSet::new())
}

/// `merged`, where the log rows of `edited` (ids whose row was edited on its own: 10xGraph's
/// `aput_messages` or ours changing a message the context holds, a redaction) take the place of
/// their context copy, text and all. The context copy won, so the first commit here put the old
/// text back: a redaction undone (red-team, session 41). 10xGraph's log keeps the edit; its
/// context, and so its next prompt, the old text.
pub fn merged_keeping_edits(
    ctx: &[Value],
    log: Vec<(Option<String>, RawJson)>,
    edited: &HashSet<String>,
) -> Vec<RawJson> {
    let at: HashMap<String, usize> = ctx.iter().enumerate().filter_map(|(i, m)| Some((id_of(m)?, i))).collect();
    // Each log row is either a context message's place (its copy comes from the context, or from
    // the row when the row was edited) or a log-only row kept where the log has it.
    let mut edits: HashMap<usize, RawJson> = HashMap::new();
    let mut order: Vec<Result<usize, RawJson>> = Vec::with_capacity(log.len());
    for (id, row) in log {
        match id.and_then(|id| at.get(&id).map(|&i| (i, edited.contains(&id)))) {
            Some((i, is_edit)) => {
                if is_edit {
                    edits.insert(i, row);
                }
                order.push(Ok(i));
            }
            None => order.push(Err(row)),
        }
    }
    let mut copy = |i: usize| edits.remove(&i).unwrap_or_else(|| raw_json(&ctx[i]));
    let mut out = Vec::with_capacity(ctx.len() + order.len());
    let mut next = 0;
    for slot in order {
        match slot {
            Ok(i) => {
                while next <= i {
                    out.push(copy(next));
                    next += 1;
                }
            }
            Err(row) => out.push(row),
        }
    }
    out.extend((next..ctx.len()).map(copy));
    results_after_their_calls(out)
}

/// The call a tool message answers: `metadata.tool_call_id`, else its result block's `call_id`.
fn answered_call(m: &Value) -> Option<&str> {
    if m.get("role").and_then(Value::as_str) != Some("tool") {
        return None;
    }
    m.get("metadata")
        .and_then(|md| md.get("tool_call_id"))
        .and_then(Value::as_str)
        .or_else(|| m.get("content")?.as_array()?.iter().find_map(|b| b.get("call_id").and_then(Value::as_str)))
}

/// 10xGraph stamps every row of one transaction with one time, and the migration ordered such
/// rows by their random ids: a whole turn logged at once (`durable_checkpoint_every_step=False`,
/// a batch of `aput_messages`) could come back with a tool result before the message that called
/// it, a history no provider takes (red-team, session 40). Such a result goes right after its
/// call (with the other results that came early, in the order of the calls).
fn results_after_their_calls(msgs: Vec<RawJson>) -> Vec<RawJson> {
    let values: Vec<Option<Value>> = msgs.iter().map(|m| serde_json::from_str(m.get()).ok()).collect();
    // Each call id: the message that made it, and its place among that message's calls.
    let mut caller: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, v) in values.iter().enumerate() {
        let calls = v.as_ref().and_then(|v| v.get("tools_calls")).and_then(Value::as_array);
        for (at, id) in calls.into_iter().flatten().filter_map(|c| c.get("id").and_then(Value::as_str)).enumerate() {
            caller.entry(id).or_insert((i, at));
        }
    }
    let early: Vec<Option<(usize, usize)>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_ref().and_then(answered_call).and_then(|c| caller.get(c)).copied().filter(|&(j, _)| j > i))
        .collect();
    if early.iter().all(Option::is_none) {
        return msgs;
    }
    let mut waiting: HashMap<usize, Vec<(usize, RawJson)>> = HashMap::new();
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.into_iter().enumerate() {
        match early[i] {
            Some((j, at)) => waiting.entry(j).or_default().push((at, m)),
            None => {
                out.push(m);
                let mut results = waiting.remove(&i).unwrap_or_default();
                results.sort_by_key(|(at, _)| *at);
                out.extend(results.into_iter().map(|(_, m)| m));
            }
        }
    }
    out
}

/// The id of a logged message as its text holds it (None: no id, or not an object).
pub fn logged_id(row: &RawJson) -> Option<String> {
    serde_json::from_str::<Value>(row.get()).ok().as_ref().and_then(id_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(v: &[RawJson]) -> Vec<String> {
        v.iter().map(|r| logged_id(r).unwrap()).collect()
    }

    fn log(ids: &[&str]) -> Vec<(Option<String>, RawJson)> {
        ids.iter().map(|i| (Some((*i).to_owned()), raw_json(&json!({"message_id": i, "from": "log"})))).collect()
    }

    fn ctx(ids: &[&str]) -> Vec<Value> {
        ids.iter().map(|i| json!({"message_id": i, "from": "ctx"})).collect()
    }

    #[test]
    fn a_trimmed_context_keeps_the_logs_earlier_turns_in_front() {
        let out = merged(&ctx(&["c", "d"]), log(&["a", "b", "c", "d"]));
        assert_eq!(ids(&out), ["a", "b", "c", "d"]);
        // The context's copy of a message is the one kept.
        assert!(out[2].get().contains("ctx") && out[0].get().contains("log"));
    }

    #[test]
    fn log_rows_inside_the_window_stay_in_place_and_the_context_keeps_its_order() {
        // Tool messages dropped from the context inside the window; two rows of one transaction
        // that the log ordered the other way round.
        let out = merged(&ctx(&["u1", "a2", "u3", "y", "x"]), log(&["u1", "t1", "r1", "a2", "u3", "x", "y"]));
        assert_eq!(ids(&out), ["u1", "t1", "r1", "a2", "u3", "y", "x"]);
    }

    #[test]
    fn a_tool_result_logged_before_its_call_goes_right_after_it() {
        let row = |v: Value| (logged_id(&raw_json(&v)), raw_json(&v));
        let log = vec![
            row(json!({"message_id": "u", "role": "user"})),
            row(json!({"message_id": "r2", "role": "tool", "metadata": {"tool_call_id": "c2"}})),
            row(json!({"message_id": "r1", "role": "tool", "content": [{"type": "tool_result", "call_id": "c1"}]})),
            row(json!({"message_id": "a", "role": "assistant", "tools_calls": [{"id": "c1"}, {"id": "c2"}]})),
            row(json!({"message_id": "r3", "role": "tool", "metadata": {"tool_call_id": "c3"}})),
            row(json!({"message_id": "b", "role": "assistant"})),
        ];
        // r3 answers no call in the thread: left where it is.
        assert_eq!(ids(&merged(&[], log)), ["u", "a", "r1", "r2", "r3", "b"]);
    }

    #[test]
    fn context_messages_the_log_lacks_and_log_rows_after_the_context_are_kept() {
        assert_eq!(ids(&merged(&ctx(&["s", "a", "b"]), log(&["a", "late"]))), ["s", "a", "late", "b"]);
        assert_eq!(ids(&merged(&ctx(&["a", "b"]), vec![])), ["a", "b"]);
        assert_eq!(ids(&merged(&[], log(&["a"]))), ["a"]);
        // An int id in the context matches the log's text.
        let out = merged(&[json!({"message_id": 7})], vec![(Some("7".into()), raw_json(&json!({"message_id": "7"})))]);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_log_row_edited_after_the_state_takes_the_place_of_its_context_copy() {
        let edited: HashSet<String> = ["c".to_owned(), "gone".to_owned()].into();
        let out = merged_keeping_edits(&ctx(&["b", "c", "d"]), log(&["a", "b", "d", "c"]), &edited);
        // The context's order, the edited row's text; the others the context's copy.
        assert_eq!(ids(&out), ["a", "b", "c", "d"]);
        assert!(out[2].get().contains("log") && out[1].get().contains("ctx") && out[3].get().contains("ctx"));
        // An edited id with no context copy is a log row as any other.
        let out = merged_keeping_edits(&ctx(&["b"]), log(&["gone", "b"]), &edited);
        assert_eq!(ids(&out), ["gone", "b"]);
    }
}
