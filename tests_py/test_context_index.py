"""The run's context index: appending a step's messages dedupes by id like add_messages, in place,
and notices a context that a node rewrote."""

from __future__ import annotations

from tenxgraph import AgentState, Message
from tenxgraph._context_index import ContextIndex
from tenxgraph.core.state.reducers import RemoveMessage, add_messages


def msg(i: str, delta: bool = False) -> Message:
    m = Message.text_message(i, role="assistant", message_id=i)
    m.delta = delta
    return m


def ids(state: AgentState) -> list[str]:
    return [str(m.message_id) for m in state.context]


def test_matches_add_messages_and_stays_in_place() -> None:
    state = AgentState(context=[msg("a"), msg("b")])
    index = ContextIndex()
    ctx = state.context
    index.append(state, [msg("c"), msg("a"), msg("d", delta=True), msg("c")])
    assert ids(state) == ["a", "b", "c"] == [str(m.message_id) for m in add_messages([msg("a"), msg("b")], [msg("c")])]
    assert state.context is ctx
    state.context.append(msg("e"))  # a node appended in place between steps
    index.append(state, [msg("e"), msg("f")])
    assert ids(state) == ["a", "b", "c", "e", "f"]


def test_a_rewritten_context_is_reindexed() -> None:
    state = AgentState(context=[msg("a"), msg("b")])
    index = ContextIndex()
    index.append(state, [msg("c")])
    state.context = [msg("x")]  # a node replaced the history
    index.append(state, [msg("a"), msg("x")])
    assert ids(state) == ["x", "a"]
    state.context[0] = msg("y")  # same list, same length, different last id: rewritten
    index.append(state, [msg("y"), msg("x")])
    assert ids(state) == ["y", "a", "x"]


def test_tombstones_use_the_full_reducer() -> None:
    state = AgentState(context=[msg("a"), msg("b")])
    index = ContextIndex()
    index.append(state, [RemoveMessage(message_id="a"), msg("c")])
    assert ids(state) == ["b", "c"]
    index.append(state, [msg("d")])
    assert ids(state) == ["b", "c", "d"]


def test_a_message_removed_and_added_again_is_appended_again() -> None:
    state = AgentState(context=[msg("a"), msg("b"), msg("c")])
    index = ContextIndex()
    index.append(state, [msg("d")])  # the index now holds a, b, c, d
    del state.context[1]  # a node drops b in place...
    index.append(state, [msg("b")])  # ...and adds an edited b: no longer present, so it goes in
    assert ids(state) == ["a", "c", "d", "b"]
    state.context[0] = msg("z")  # same length, an element replaced in the middle of the list
    index.append(state, [msg("a"), msg("z")])
    assert ids(state) == ["z", "c", "d", "b", "a"]


def test_an_unchanged_context_is_not_rescanned() -> None:
    state = AgentState(context=[msg(str(i)) for i in range(50)])
    index = ContextIndex()
    index.append(state, [msg("new-1")])
    built = index._ids
    index.append(state, [msg("new-2"), msg("3")])  # "3" is already there
    assert index._ids is built and ids(state)[-2:] == ["new-1", "new-2"] and len(state.context) == 52
