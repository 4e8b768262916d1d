"""Throwaway PostgreSQL and Redis servers for tests (stdlib only).

``start_postgres()`` runs ``initdb`` into a fresh temporary directory and starts a
server with ``pg_ctl`` on a free port of 127.0.0.1; ``start_redis()`` starts
``redis-server`` as a subprocess on a free port of 127.0.0.1.  Both return objects
with ``stop()`` and context-manager support.

Set ``TENXGRAPH_TEST_PG_DSN`` / ``TENXGRAPH_TEST_REDIS_URL`` to use an existing server instead:
nothing is started and ``stop()`` does nothing.

Servers are stopped when the interpreter exits (``atexit``) if the caller forgot.  Each
server also gets a tiny watchdog process that holds a pipe to this process: if this
process dies without cleaning up (SIGKILL, ``os._exit``, pytest-timeout's thread
method, a CI runner killing the process group), the watchdog sees EOF and stops the
server and removes its files.

PostgreSQL refuses to run as root: when running as root, ``initdb``/``pg_ctl`` run as
the ``postgres`` OS user (``runuser -u postgres``) on a directory it owns.  When
``redis-server`` is missing and we are root with ``apt-get``, it is installed
(``apt-get install redis-server``) without letting the package start its system
service.
"""

# The servers live in modules of their own; this one keeps the public names where users import them.
from tenxgraph.testing._apt import apt_install
from tenxgraph.testing._server import PG_DSN_ENV, REDIS_URL_ENV
from tenxgraph.testing.postgres_server import PostgresServer, find_pg_binary, start_postgres
from tenxgraph.testing.redis_server import RedisServer, find_redis_server, redis_command, start_redis

__all__ = [
    "PG_DSN_ENV",
    "apt_install",
    "REDIS_URL_ENV",
    "PostgresServer",
    "RedisServer",
    "find_pg_binary",
    "find_redis_server",
    "redis_command",
    "start_postgres",
    "start_redis",
]
