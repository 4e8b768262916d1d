"""``apt-get install`` of a test server's package without starting its system service."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import subprocess
from typing import Callable


_APT_INSTALL_LOCK = "/tmp/tenx-apt-install.lock"
_POLICY_RC_D = "/usr/sbin/policy-rc.d"


def apt_install(package: str, installed: Callable[[], object]) -> None:
    """``apt-get install <package>`` without starting its system service (root only).

    Serialised with a file lock (parallel test processes); ``installed()`` is checked again under
    the lock. ``policy-rc.d`` exit 101 keeps the package's postinst from starting a server that
    would outlive us.
    """
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(_APT_INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return
        created_policy = False
        if not os.path.exists(_POLICY_RC_D):
            with open(_POLICY_RC_D, "w") as f:
                f.write("#!/bin/sh\n# temporary, written by tenxgraph.testing: do not start services\nexit 101\n")
            os.chmod(_POLICY_RC_D, 0o755)
            created_policy = True
        try:
            apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]
            steps = [
                [*apt, "update", "-qq"],
                [*apt, "install", "-y", "-qq", "--no-install-recommends", package],
            ]
            for cmd in steps:
                res = subprocess.run(
                    cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
                )
                if res.returncode != 0:
                    raise RuntimeError(
                        f"`{shlex.join(cmd)}` failed (exit {res.returncode}) while installing {package}:\n"
                        f"{(res.stdout + res.stderr).strip()[-4000:]}"
                    )
        finally:
            if created_policy:
                with contextlib.suppress(OSError):
                    os.unlink(_POLICY_RC_D)


