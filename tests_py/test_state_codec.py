"""The stored form of a step's state (tenxgraph._state_codec): the JSON text a step sends is the
dict form's document, key for key and in order, and refuses what the dict form refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph._state_codec import STATE_META_KEY, encode_state, encode_state_json


class Rich(AgentState):
    note: str = ""
    scores: dict[str, float] = {}
    big: int = 0
    nested: list[dict[str, Any]] = []
    count: int = 0


def samples() -> list[AgentState]:
    plain = AgentState()
    plain.context.append(Message.text_message("left out of a step", role="user"))
    rich = Rich(note="naïve ☃ \"quoted\" \\ back", scores={"a": 1e16, "b": -0.0, "c": 2.5}, big=2**70,
                nested=[{"k": [1, None, True]}, {}])
    rich.execution_meta.step = 7
    return [plain, rich, Rich()]


@pytest.mark.parametrize("index", range(3))
def test_the_step_text_is_the_dict_form_key_for_key(index: int) -> None:
    state = samples()[index]
    text = encode_state_json(state)
    want = encode_state(state, with_context=False)
    got = json.loads(text)
    assert got == want
    assert list(got) == list(want) and list(got)[-1] == STATE_META_KEY
    assert "context" not in got


def test_a_state_that_would_not_load_back_is_refused_by_both_forms() -> None:
    state = Rich()
    state.count = "not a number"  # type: ignore[assignment]  # assignments are not validated
    for encode in (lambda: encode_state(state, with_context=False), lambda: encode_state_json(state)):
        with pytest.raises(ValueError, match="would not load back"):
            encode()


def test_a_value_pydantic_warns_about_but_that_loads_back_is_stored_by_both() -> None:
    state = Rich()
    state.big = 3.0  # type: ignore[assignment]  # a float where an int goes: warned, loads back as 3
    assert json.loads(encode_state_json(state)) == encode_state(state, with_context=False)
