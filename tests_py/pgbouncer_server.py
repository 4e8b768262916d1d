"""A throwaway PgBouncer in front of the tests' PostgreSQL (Debian's ``pgbouncer``).

Installed with apt when missing and we are root, as ``tests_py/rabbitmq_server.py`` does for its
broker. Each one gets its own port and directory, trusts every user (the server behind it does),
and a watchdog that stops it if the test process dies. PgBouncer refuses to run as root: started
by root, it switches to the ``postgres`` user.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from urllib.parse import urlsplit

from tenxgraph.testing._server import (
    _ChildServer,
    _find_or_install,
    _free_port,
    _is_root,
    _short_tmp_base,
    _tail,
    _Watchdog,
)


class PgBouncer(_ChildServer):
    """A running PgBouncer: ``dsn_for(dbname)`` names a database through it."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, user: str, root: str) -> None:
        super().__init__(proc, port, root)
        self._user = user

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://{self._user}@127.0.0.1:{self.port}/{dbname}"


def start_pgbouncer(server_dsn: str, pool_mode: str, pool_size: int = 4, timeout: float = 30.0) -> PgBouncer:
    """PgBouncer in ``pool_mode`` ("session" or "transaction") in front of ``server_dsn``'s server,
    with ``pool_size`` server connections per database and user."""
    binary = _find_or_install("pgbouncer", "/usr/sbin/pgbouncer")
    target = urlsplit(server_dsn)
    user = target.username or "postgres"
    root = tempfile.mkdtemp(prefix="tenx-pgb-", dir=_short_tmp_base())
    os.chmod(root, 0o755)
    port = _free_port()
    with open(os.path.join(root, "users.txt"), "w") as f:
        f.write(f'"{user}" ""\n')
    with open(os.path.join(root, "pgbouncer.ini"), "w") as f:
        f.write(
            "[databases]\n"
            f"* = host={target.hostname} port={target.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"  # TCP only
            f"auth_type = trust\nauth_file = {root}/users.txt\npool_mode = {pool_mode}\n"
            f"max_client_conn = 100\ndefault_pool_size = {pool_size}\n"
            # sqlx sends these at startup; PgBouncer refuses unknown ones unless told to ignore them.
            "ignore_startup_parameters = extra_float_digits,options,application_name\n"
        )
    cmd = [binary, os.path.join(root, "pgbouncer.ini")]
    if _is_root():
        cmd[1:1] = ["-u", "postgres"]
    log = os.path.join(root, "out.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                start_new_session=True)
    bouncer = PgBouncer(proc, port, user, root)
    bouncer._register()
    bouncer._watchdog = _Watchdog({"pid": proc.pid, "marker": "pgbouncer", "rmtree": [root], "cmds": []})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return bouncer
        except OSError:
            time.sleep(0.1)
    tail = _tail(log)
    bouncer.stop()
    raise RuntimeError(f"pgbouncer did not listen on port {port} within {timeout:.0f}s:\n{tail}")
