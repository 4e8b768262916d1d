"""A stored state is validated without ``Message.content``'s string-to-block validator (issue 16:
from JSON, that Python call made pydantic-core build each message's content twice); whatever
that copy of the schema refuses is validated by the class itself, so a load gives the same state,
and the same errors, as ``model_validate_json``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import Field, ValidationError, field_validator, model_validator

from tenxgraph._cold_load import _stored_validator, validate_stored_state
from tenxgraph.core.state import AgentState, Message
from tests_py.test_state_models import full_message


class Ticketed(AgentState):
    """A user's state: its own fields and validators, the context's messages among them."""

    ticket: str = "T-0"
    notes: list[Message] = Field(default_factory=list)
    seen: int = 0

    @field_validator("ticket")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()

    @model_validator(mode="after")
    def _count(self) -> "Ticketed":
        self.seen = len(self.context) + len(self.notes)
        return self


def stored(state: AgentState) -> str:
    return state.model_dump_json()


@pytest.mark.parametrize("state_type", [AgentState, Ticketed])
def test_a_load_is_the_class_validation(state_type: type[AgentState]) -> None:
    messages = [full_message(message_id=f"m{i}") for i in range(3)]
    messages.append(Message(message_id="t", role="tool", content="plain", metadata={"tool_call_id": "c"}))
    extra: dict[str, Any] = {"ticket": "t-9", "notes": [full_message(message_id="n")]} if state_type is Ticketed else {}
    text = stored(state_type(context=messages, **extra))
    assert _stored_validator(state_type) is not None, "no copy of the schema was made: loads validate content twice"
    loaded = validate_stored_state(state_type, text)
    assert type(loaded) is state_type
    assert loaded == state_type.model_validate_json(text)
    assert [type(b) for b in loaded.context[0].content] == [type(b) for b in messages[0].content]
    if isinstance(loaded, Ticketed):
        assert (loaded.ticket, loaded.seen, loaded.notes[0].message_id) == ("T-9", 5, "n")


def test_the_copy_has_no_content_validator_and_the_classes_stay_complete() -> None:
    fast = _stored_validator(Ticketed)
    assert fast is not None
    text = json.dumps({"context": [{"role": "user", "content": "as a string"}]})
    with pytest.raises(ValidationError):
        fast.validate_json(text)
    for cls in (Message, AgentState, Ticketed):
        assert cls.__dict__.get("__pydantic_complete__") is True, cls
    # The class's own validators are untouched: a string is still a TextBlock, both ways.
    assert Message(role="user", content="s").content[0].text == "s"
    assert Message.model_validate_json('{"role": "user", "content": "s"}').content[0].text == "s"


def test_text_the_copy_refuses_loads_as_the_class_loads_it() -> None:
    """Content stored as a string (a row edited by hand, a writer that dumped it so): the class
    validates it into a TextBlock, and so does a load."""
    text = json.dumps({"context": [{"message_id": "u", "role": "user", "content": "typed by hand", "timestamp": 1.5}]})
    loaded = validate_stored_state(AgentState, text)
    assert loaded == AgentState.model_validate_json(text)
    assert loaded.context[0].content[0].text == "typed by hand"


def test_a_state_that_does_not_load_fails_with_the_class_errors() -> None:
    text = json.dumps({"context": [{"role": "robot", "content": []}, {"role": "user", "content": 5}]})
    with pytest.raises(ValidationError) as theirs:
        AgentState.model_validate_json(text)
    with pytest.raises(ValidationError) as ours:
        validate_stored_state(AgentState, text)
    assert ours.value.errors() == theirs.value.errors()
