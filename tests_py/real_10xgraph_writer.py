"""Threads written by the real 10xGraph 0.10.0 (the oracle venv) into a test's Postgres + Redis.

``crash_in_tool_node`` starts ``crash_agents/legacy_tool_agent.py`` on 10xGraph as a child
process, waits until its ``email`` tool is blocked and ``charge``'s ledger row has committed, and
SIGKILLs it there: the database and the Redis cache are what a 10xGraph process killed inside its
tool node leaves behind. ``run_to_completion`` runs the same agent uncrashed (the reference for
what the thread should end as). The waits poll files and the database with generous deadlines; no
timing is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests_py import oracle_spawn

AGENT = Path(__file__).parent / "crash_agents" / "legacy_tool_agent.py"
USER = "u1"
DEADLINE = 180.0


def lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def dbname_of(dsn: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(dsn).path.lstrip("/"))


@dataclass
class Writer:
    """Runs the agent on 10xGraph against one database and Redis."""

    python: str  # the oracle venv's interpreter
    pg: Any  # tenxgraph.testing.services.PostgresServer
    dsn: str
    redis_url: str
    workdir: Path

    def env(self, thread: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(PG_DSN=self.dsn, REDIS_URL=self.redis_url, THREAD=thread, LEGACY_AGENT_DIR=str(self.workdir))
        env.update(extra)
        return env

    def sql(self, query: str) -> str:
        return self.pg.psql(query, dbname=dbname_of(self.dsn)).strip()

    def effects(self) -> list[dict[str, Any]]:
        path = self.workdir / "effects.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def crash_in_tool_node(self, thread: str, *, nondurable: bool = False, turn: int = 1, mode: str = "start",
                           ours: bool = False, **env: str) -> dict[str, Any]:
        """Kills 10xGraph inside the tool node of its turn ``turn`` (``mode="resume"``: of its
        ``ainvoke({})``) once ``charge`` is in its ledger; returns what it left: the ledger row, the
        state rows and the Redis cache entry (raw). ``ours``: the writer is tenxgraph (``python``
        is its interpreter), whose ledger keys a call by its message id and call id as JSON."""
        (self.workdir / "email.release").unlink(missing_ok=True)
        (self.workdir / "email.ready").unlink(missing_ok=True)
        extra = {"NONDURABLE": "1"} if nondurable else {}
        extra.update(env)
        suffix = ""
        if turn > 1:
            extra["LEGACY_AGENT_TURN"] = str(turn)
            suffix = f"-t{turn}"
        log = self.workdir / f"10xgraph-{thread}.log"
        log.write_text("")
        proc = oracle_spawn.spawn(self.python, [str(AGENT), mode], env=self.env(thread, **extra), cwd=self.workdir,
                                  stdout=log)
        key = f"{thread}{suffix}-a-1:call_1{suffix}"
        if ours:
            key = json.dumps([f"{thread}{suffix}-a-1", f"call_1{suffix}"], separators=(",", ":"))
        try:
            deadline = time.monotonic() + DEADLINE
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"10xGraph exited (rc={proc.returncode}) before the crash point:\n"
                                         + (self.workdir / f"10xgraph-{thread}.log").read_text()[-3000:])
                ready = (self.workdir / "email.ready").exists()
                recorded = ready and self.sql(
                    "SELECT count(*) FROM tool_executions WHERE thread_id = "
                    f"{lit(thread)} AND tool_call_id = {lit(key)}"
                ) == "1"
                if recorded:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("10xGraph never reached the crash point (email blocked, charge recorded)")
                time.sleep(0.1)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        ledger = json.loads(self.sql(
            f"SELECT result FROM tool_executions WHERE thread_id = {lit(thread)} AND tool_call_id = {lit(key)}"
        ))
        return {"ledger_key": key, "ledger": ledger, "states": self.states(thread),
                "cache": self.redis_get(self.cache_key(thread))}

    def crash_in_model_node(self, thread: str, *, first: bool = False, nondurable: bool = False,
                            turn: int = 1, **env: str) -> dict[str, Any]:
        """Kills 10xGraph inside its second model call, after the tool node's step committed
        (``first``: inside the turn's first model call, before any tool); returns the state rows
        and the Redis cache entry (raw) it left."""
        (self.workdir / "email.release").write_text("go")
        (self.workdir / "model.ready").unlink(missing_ok=True)
        extra = {"NONDURABLE": "1"} if nondurable else {}
        extra.update(env)
        if turn > 1:
            extra["LEGACY_AGENT_TURN"] = str(turn)
        if first:
            (self.workdir / "model.hang").write_text("1")
        else:
            extra["LEGACY_AGENT_BLOCK_MODEL"] = "1"
        log = self.workdir / f"10xgraph-{thread}.log"
        log.write_text("")
        proc = oracle_spawn.spawn(self.python, [str(AGENT), "start"], env=self.env(thread, **extra), cwd=self.workdir,
                                  stdout=log)
        try:
            deadline = time.monotonic() + DEADLINE
            while not (self.workdir / "model.ready").exists():
                if proc.poll() is not None:
                    raise AssertionError(f"10xGraph exited (rc={proc.returncode}) before the crash point:\n"
                                         + (self.workdir / f"10xgraph-{thread}.log").read_text()[-3000:])
                if time.monotonic() > deadline:
                    raise AssertionError("10xGraph never reached the model call it was to be killed in")
                time.sleep(0.1)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        return {"states": self.states(thread), "cache": self.redis_get(self.cache_key(thread))}

    def states(self, thread: str) -> list[dict[str, Any]]:
        return json.loads(self.sql(
            "SELECT COALESCE(json_agg(x ORDER BY x.version), '[]'::json) FROM (SELECT version, "
            "state_data->'execution_meta' AS meta, state_data->'context' AS context FROM states WHERE "
            f"thread_id = {lit(thread)}) x"
        ))

    def run(self, thread: str, mode: str = "start", **extra: str) -> subprocess.CompletedProcess[str]:
        """The agent run on 10xGraph, tools unblocked (``mode="resume"``: ``ainvoke({})``)."""
        (self.workdir / "email.release").write_text("go")
        return oracle_spawn.run(self.python, [str(AGENT), mode], env=self.env(thread, **extra), cwd=self.workdir,
                                timeout=DEADLINE)

    def run_to_completion(self, thread: str, mode: str = "start", **extra: str) -> dict[str, Any]:
        """``run``, which must succeed; what it printed."""
        r = self.run(thread, mode, **extra)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode != 0 or not lines:
            raise AssertionError(f"10xGraph run failed (rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])

    def cache_key(self, thread: str) -> str:
        return f"state_cache:{thread}:{USER}"

    def _client(self) -> Any:
        """A Redis client on the URL's database (redis-py, which the test extras install)."""
        import redis

        return redis.Redis.from_url(self.redis_url)

    def redis_get(self, key: str) -> str | None:
        with self._client() as r:
            if r.type(key) != b"string":
                return None
            return r.get(key).decode()

    def redis_type(self, key: str) -> str:
        with self._client() as r:
            return r.type(key).decode()

    def redis_set(self, key: str, value: str) -> None:
        with self._client() as r:
            r.set(key, value)

    def redis_copy_to(self, key: str, db: int) -> str:
        """Copies ``key`` into Redis database ``db``; returns the URL of that database."""
        with self._client() as r:
            r.copy(key, key, destination_db=db, replace=True)
        return self.redis_url_of_db(db)

    def redis_url_of_db(self, db: int) -> str:
        parts = urllib.parse.urlsplit(self.redis_url)
        return urllib.parse.urlunsplit(parts._replace(path=f"/{db}"))

    def copy_database(self, name: str) -> str:
        """A copy of the test's database as it is now (CREATE DATABASE ... TEMPLATE); its DSN."""
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                self.pg.psql(f'CREATE DATABASE "{name}" TEMPLATE "{dbname_of(self.dsn)}"', dbname="postgres")
                break
            except RuntimeError as e:
                # The killed client's sessions may take a moment to go away.
                if "being accessed by other users" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return self.pg.dsn_for(name)
