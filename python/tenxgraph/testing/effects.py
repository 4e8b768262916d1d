"""A side-effect counter that lives outside the process under test.

Crash tests kill processes with SIGKILL; a counter in memory dies with them. ``EffectCounter``
appends one JSON line per effect to a file (``O_APPEND``, under ``flock``, ``fsync`` before
``record`` returns), so every process that shares the path sees every effect that happened,
including those of a process killed right after recording.

    counter = EffectCounter(tmp_path / "effects.jsonl")
    counter.record("charge", order="4821")          # in a tool, in any process
    counter.assert_exactly_once("charge")           # in the test

Tools running in child processes find the file through the ``TENXGRAPH_EFFECTS`` environment
variable: ``EffectCounter.from_env().record("charge")``. The pytest fixture ``effects`` sets it
for the test (and so for every child process the test starts).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EFFECTS_ENV", "Effect", "EffectCounter"]

EFFECTS_ENV = "TENXGRAPH_EFFECTS"


@dataclass(frozen=True)
class Effect:
    """One recorded effect: its name, the keyword data given to ``record``, who and when."""

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    pid: int = 0
    time: float = 0.0


class EffectCounter:
    """Counts named side effects in an append-only JSON-lines file shared by processes.

    Safe across processes and threads: each ``record`` is one ``write`` of one line on an
    ``O_APPEND`` descriptor under an exclusive ``flock``, fsynced before returning. A line cut
    short (a process killed in the middle of ``write``, which a single small write makes
    practically impossible) is ignored by readers instead of breaking them.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"EffectCounter({str(self.path)!r})"

    @classmethod
    def from_env(cls, env: str = EFFECTS_ENV) -> EffectCounter:
        """The counter whose path is in ``$TENXGRAPH_EFFECTS`` (set by the ``effects`` fixture)."""
        path = os.environ.get(env)
        if not path:
            raise RuntimeError(
                f"${env} is not set: use the `effects` pytest fixture (tenxgraph.testing), or set {env} "
                "to a file path shared by the processes whose effects you count"
            )
        return cls(path)

    # -- writing ---------------------------------------------------------------------------

    def record(self, name: str, /, **data: Any) -> None:
        """Appends one effect ``name`` (with JSON-able ``data``); durable when this returns.
        ``name`` is positional only, so the data may have a field called ``name`` too."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"effect name must be a non-empty str, got {name!r}")
        line = json.dumps({"name": name, "data": data, "pid": os.getpid(), "time": time.time()},
                          default=str, separators=(",", ":"))
        payload = (line + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                written = os.write(fd, payload)
                if written != len(payload):  # never seen on a local file; do not leave half a line
                    raise OSError(f"short write to {self.path}: {written} of {len(payload)} bytes")
                os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Forgets every recorded effect (truncates the file)."""
        with contextlib.suppress(FileNotFoundError), open(self.path, "r+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            f.truncate(0)
            os.fsync(f.fileno())

    # -- reading ---------------------------------------------------------------------------

    def _lines(self) -> Iterator[dict[str, Any]]:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return
        with f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)
            raw = f.read()
        for line in raw.split(b"\n")[:-1]:  # the part after the last newline is incomplete
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a torn line: not an effect that completed its record
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                yield obj

    def all(self, name: str | None = None) -> list[Effect]:
        """Every recorded effect in order (only those called ``name`` when given)."""
        out = []
        for obj in self._lines():
            if name is None or obj["name"] == name:
                out.append(Effect(obj["name"], dict(obj.get("data") or {}), int(obj.get("pid", 0)),
                                  float(obj.get("time", 0.0))))
        return out

    def count(self, name: str) -> int:
        """How many times ``name`` was recorded."""
        return sum(1 for obj in self._lines() if obj["name"] == name)

    def counts(self) -> dict[str, int]:
        """``{name: count}`` for every recorded name, in order of first appearance."""
        return dict(Counter(obj["name"] for obj in self._lines()))

    def distinct(self, name: str, by: str) -> list[Any]:
        """The distinct values of ``data[by]`` among the ``name`` effects, in order of first
        appearance. With ``by="key"`` for an idempotency key: what an external system that
        deduplicates by that key performed.

        Raises ``KeyError`` (naming the data keys the records do have) when a ``name`` record has
        no ``by`` at all: counting it as a value would let a misspelt field name make every record
        look alike. A field recorded as None is a value like any other."""
        out: list[Any] = []
        seen: set[str] = set()
        lacking = 0
        for obj in self._lines():
            if obj["name"] == name:
                data = obj.get("data") or {}
                if by not in data:
                    lacking += 1
                    continue
                value = data[by]
                marker = json.dumps(value, sort_keys=True, default=str)
                if marker not in seen:
                    seen.add(marker)
                    out.append(value)
        if lacking:
            raise KeyError(self._lacking(name, by, lacking))
        return out

    def _lacking(self, name: str, by: str, lacking: int) -> str:
        records = self.all(name)
        keys = sorted({k for e in records for k in e.data})
        have = ", ".join(repr(k) for k in keys) if keys else "none (recorded without data)"
        return (f"{lacking} of {len(records)} {name!r} record(s) have no {by!r} in their data; "
                f"the data keys they have: {have}")

    def names(self) -> list[str]:
        """The distinct recorded names, in order of first appearance."""
        return list(self.counts())

    # -- assertions ------------------------------------------------------------------------

    def _explain(self, names: tuple[str, ...] | list[str]) -> str:
        lines = []
        for e in self.all():
            if e.name in names:
                lines.append(f"    {e.name} pid={e.pid} {json.dumps(e.data, default=str)}")
        return "\n".join(lines) or "    (none)"

    def assert_exactly_once(self, *names: str, by: str | None = None) -> None:
        """Each of ``names`` was recorded exactly once (no names: every recorded name).

        ``by="key"``: exactly one distinct ``data["key"]`` per name instead (repeats with the
        same key allowed), i.e. exactly once as seen by a system that deduplicates by that key.
        A record of one of ``names`` without ``by`` in its data fails the assertion, naming the
        data keys the records have (a misspelt ``by`` must not pass).
        """
        counts = self.counts()
        wanted = list(names) or list(counts)
        if not wanted:
            raise AssertionError(f"no effect recorded at all in {self.path}")
        if by is None:
            wrong = {n: counts.get(n, 0) for n in wanted if counts.get(n, 0) != 1}
            what = "exactly once each"
        else:
            wrong = {}
            for n in wanted:
                try:
                    k = len(self.distinct(n, by)) if counts.get(n, 0) else 0
                except KeyError as e:
                    raise AssertionError(f"assert_exactly_once({n!r}, by={by!r}): {e.args[0]}; records:\n"
                                         + self._explain([n])) from None
                if k != 1:
                    wrong[n] = k
            what = f"exactly one distinct {by!r} each (distinct counts shown)"
        if wrong:
            raise AssertionError(
                f"expected {what}: {wanted}; got {wrong} (all counts: {counts}); records:\n"
                + self._explain(list(wrong))
            )

    def assert_at_most(self, name: str, n: int) -> None:
        """``name`` was recorded at most ``n`` times (zero is fine)."""
        got = self.count(name)
        if got > n:
            raise AssertionError(f"expected {name!r} at most {n} time(s), got {got}; records:\n"
                                 + self._explain([name]))
