"""``python -m tenxgraph.testing serve ENV_FILE``: start a throwaway PostgreSQL and Redis, write
``TENXGRAPH_TEST_PG_DSN=...`` and ``TENXGRAPH_TEST_REDIS_URL=...`` to ENV_FILE, and keep them
running until this process gets SIGTERM/SIGINT (or its stdin closes, when it is a pipe).
Used by scripts/test.sh so Rust tests and pytest share one pair of servers."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import threading

from tenxgraph.testing.services import PG_DSN_ENV, REDIS_URL_ENV, start_postgres, start_redis


def _stop_at_eof(stop: threading.Event) -> None:
    """Sets ``stop`` once stdin reaches EOF (its writer closed it or died); what it reads is dropped."""
    with contextlib.suppress(OSError):
        while os.read(0, 65536):
            pass
    stop.set()


def serve(env_file: str) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Only a pipe: a terminal or /dev/null (a background job's stdin in a script) says nothing
    # about the owner, and /dev/null would read EOF at once.
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.fstat(0).st_mode):
            threading.Thread(target=_stop_at_eof, args=(stop,), name="serve-stdin", daemon=True).start()
    pg = start_postgres()
    redis = start_redis()
    try:
        tmp = env_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{PG_DSN_ENV}={pg.dsn}\n{REDIS_URL_ENV}={redis.url}\n")
        os.replace(tmp, env_file)  # appears complete or not at all
        print(f"postgres {pg.dsn}  redis {redis.url}", flush=True)
        stop.wait()
    finally:
        redis.stop()
        pg.stop()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "serve":
        print(__doc__, file=sys.stderr)
        return 2
    return serve(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
