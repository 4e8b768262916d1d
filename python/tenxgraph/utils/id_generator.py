"""ID generators, as 10xGraph's ``tenxgraph.utils.id_generator`` names them: each says what kind of
id it makes (``id_type``) and makes one (``generate()``, a coroutine for ``AsyncIDGenerator``)."""

from __future__ import annotations

import secrets
import string
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from enum import Enum

__all__ = [
    "AsyncIDGenerator",
    "BaseIDGenerator",
    "BigIntIDGenerator",
    "DefaultIDGenerator",
    "HexIDGenerator",
    "IDType",
    "IntIDGenerator",
    "ShortIDGenerator",
    "TimestampIDGenerator",
    "UUIDGenerator",
]

_SHORT_ALPHABET = string.ascii_letters + string.digits


class IDType(str, Enum):
    """The kind of id a generator makes: string, integer or bigint (10xGraph's values)."""
    STRING = "string"
    INTEGER = "integer"
    BIGINT = "bigint"


class BaseIDGenerator(ABC):
    """An id generator: ``id_type`` says what it makes, ``generate()`` makes one (or an awaitable
    of one). ``StateGraph(id_generator=...)`` makes its ``generate`` the message id generator of
    the process (see ``tenxgraph.core.state.message.generate_id``)."""
    @property
    @abstractmethod
    def id_type(self) -> IDType:
        """The ``IDType`` of the ids ``generate()`` returns."""

    @abstractmethod
    def generate(self) -> str | int | Awaitable[str | int]:
        """A new id (a str or int, or an awaitable of one)."""


class UUIDGenerator(BaseIDGenerator):
    """A UUID4 string (36 characters)."""

    @property
    def id_type(self) -> IDType:
        return IDType.STRING

    def generate(self) -> str:
        return str(uuid.uuid4())


class DefaultIDGenerator(BaseIDGenerator):
    """The empty string: "use the framework's default" (a UUID4)."""

    @property
    def id_type(self) -> IDType:
        return IDType.STRING

    def generate(self) -> str:
        return ""


class BigIntIDGenerator(BaseIDGenerator):
    """Nanoseconds since the Unix epoch: sortable by creation time, 19-20 digits."""

    @property
    def id_type(self) -> IDType:
        return IDType.BIGINT

    def generate(self) -> int:
        return time.time_ns()


class IntIDGenerator(BaseIDGenerator):
    """A random 32-bit integer (0 to 2**32 - 1)."""

    @property
    def id_type(self) -> IDType:
        return IDType.INTEGER

    def generate(self) -> int:
        return secrets.randbits(32)


class HexIDGenerator(BaseIDGenerator):
    """32 random hex digits."""

    @property
    def id_type(self) -> IDType:
        return IDType.STRING

    def generate(self) -> str:
        return secrets.token_hex(16)


class TimestampIDGenerator(BaseIDGenerator):
    """Microseconds since the Unix epoch: sortable by creation time, 16-17 digits."""

    @property
    def id_type(self) -> IDType:
        return IDType.INTEGER

    def generate(self) -> int:
        return time.time_ns() // 1000


class ShortIDGenerator(BaseIDGenerator):
    """8 random letters and digits."""

    @property
    def id_type(self) -> IDType:
        return IDType.STRING

    def generate(self) -> str:
        return "".join(secrets.choice(_SHORT_ALPHABET) for _ in range(8))


class AsyncIDGenerator(BaseIDGenerator):
    """A UUID4 string, from a coroutine."""

    @property
    def id_type(self) -> IDType:
        return IDType.STRING

    async def generate(self) -> str:
        return str(uuid.uuid4())
