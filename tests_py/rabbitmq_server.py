"""A throwaway RabbitMQ broker for the publisher tests (Debian's ``rabbitmq-server``).

Installed with apt when missing and we are root, as ``tenxgraph.testing.services`` does for
Redis. Each broker gets its own node name, data directory and ports (AMQP, distribution, and an
epmd of its own, stopped with it), and a watchdog that stops it if the test process dies.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import uuid

from tenxgraph.testing._server import (
    _ChildServer,
    _find_or_install,
    _free_port,
    _short_tmp_base,
    _tail,
    _Watchdog,
)

_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
_EPMD = "/usr/bin/epmd"


def find_rabbitmq() -> str:
    """Path of the broker's start script; apt-installs ``rabbitmq-server`` when missing (root)."""
    return _find_or_install("rabbitmq-server", _SERVER)


def _amqp_ready(port: int) -> bool:
    """True when a broker answers the AMQP 0-9-1 protocol header with a Connection.Start frame."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            return s.recv(1)[:1] == b"\x01"  # a method frame
    except OSError:
        return False


class RabbitMQServer(_ChildServer):
    """A running broker: ``url`` (``amqp://guest:guest@127.0.0.1:PORT/``), ``port``, ``pid``."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, epmd_port: int, root: str) -> None:
        super().__init__(proc, port, root)
        self._epmd_port = epmd_port
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"

    def _after_stop(self) -> None:
        subprocess.run([_EPMD, "-kill"], env=dict(os.environ, ERL_EPMD_PORT=str(self._epmd_port)),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def start_rabbitmq(timeout: float = 120.0) -> RabbitMQServer:
    """Starts a broker on free 127.0.0.1 ports and waits until it speaks AMQP."""
    binary = find_rabbitmq()
    root = tempfile.mkdtemp(prefix="tenx-rmq-", dir=_short_tmp_base())
    os.chmod(root, 0o755)
    port, dist, epmd = _free_port(), _free_port(), _free_port()
    with open(os.path.join(root, "enabled_plugins"), "w") as f:
        f.write("[].\n")
    with open(os.path.join(root, "rabbitmq.conf"), "w") as f:
        # loopback_users: guest may log in from 127.0.0.1 (the default already allows it); the
        # listener binds loopback only.
        f.write(f"listeners.tcp.1 = 127.0.0.1:{port}\n")
    env = dict(
        os.environ, HOME=root, RABBITMQ_NODENAME=f"tenx{uuid.uuid4().hex[:8]}@localhost",
        RABBITMQ_NODE_PORT=str(port), RABBITMQ_DIST_PORT=str(dist), ERL_EPMD_PORT=str(epmd),
        RABBITMQ_MNESIA_BASE=os.path.join(root, "mnesia"), RABBITMQ_LOG_BASE=os.path.join(root, "log"),
        RABBITMQ_CONFIG_FILE=os.path.join(root, "rabbitmq.conf"),
        RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(root, "enabled_plugins"),
        RABBITMQ_PID_FILE=os.path.join(root, "pid"),
        # The start script then execs the VM instead of waiting on it in a shell: our pid is the
        # broker's, so a test's SIGKILL or SIGSTOP reaches the broker itself.
        RUNNING_UNDER_SYSTEMD="1",
    )
    log = os.path.join(root, "out.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=root, start_new_session=True)
    server = RabbitMQServer(proc, port, epmd, root)
    server._register()
    server._watchdog = _Watchdog({"pid": proc.pid, "marker": "rabbitmq", "rmtree": [root],
                                  "cmds": []})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if _amqp_ready(port):
            return server
        time.sleep(0.2)
    tail = _tail(log)
    server.stop()
    raise RuntimeError(f"rabbitmq-server did not answer on port {port} within {timeout:.0f}s:\n{tail}")
