"""TCP proxies to PostgreSQL that turn connections into a network blackhole (both directions
swallowed, sockets left open): the tests of "nothing hangs" for statements and transactions, and
for what happens to the connections afterwards."""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import urlsplit, urlunsplit


class _Proxy:
    """A forwarding proxy on its own event-loop thread; subclasses decide when a connection dies."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.writers: set[asyncio.StreamWriter] = set()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0),
                                                       self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    def dsn_for(self, dsn: str, app: str) -> str:
        parts = urlsplit(dsn)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        query = (parts.query + "&" if parts.query else "") + f"application_name={app}"
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.port}", query=query))

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(*self.target)
        self.writers |= {cw, sw}
        state = self._new_connection()
        await asyncio.gather(self._pump(cr, sw, state, upstream=True), self._pump(sr, cw, state, upstream=False))

    def _new_connection(self) -> dict[str, bool]:
        return {"dead": False}

    def _forward(self, data: bytes, state: dict[str, bool], upstream: bool) -> bool:
        return True

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, bool], upstream: bool) -> None:
        try:
            while data := await r.read(65536):
                if state["dead"] or not self._forward(data, state, upstream):
                    continue  # swallowed: the blackhole
                w.write(data)
                await w.drain()
        except (OSError, asyncio.CancelledError):
            pass

    def stop(self) -> None:
        async def close() -> None:
            for w in list(self.writers):
                w.close()
            self.server.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class BlackholeAfterBegin(_Proxy):
    """Once armed, the first client packet that follows a BEGIN on a connection is held, and
    nothing more is forwarded either way (a network blackhole that starts right after the
    transaction began: BEGIN answered, the next statement never is)."""

    def __init__(self, host: str, port: int) -> None:
        self.armed = False
        self.tripped = threading.Event()
        super().__init__(host, port)

    def _new_connection(self) -> dict[str, bool]:
        return {"dead": False, "began": False}

    def _forward(self, data: bytes, state: dict[str, bool], upstream: bool) -> bool:
        if upstream and self.armed:
            if state["began"]:
                state["dead"] = True
                self.tripped.set()
                return False
            if b"BEGIN" in data:
                state["began"] = True
        return True


class FreezeProxy(_Proxy):
    """``freeze()`` turns every connection open at that moment into a blackhole; connections
    opened later pass."""

    def __init__(self, host: str, port: int) -> None:
        self.conns: list[dict[str, bool]] = []
        super().__init__(host, port)

    def _new_connection(self) -> dict[str, bool]:
        state = {"dead": False}
        self.conns.append(state)
        return state

    def freeze(self) -> int:
        for c in self.conns:
            c["dead"] = True
        return len(self.conns)


SYNC = b"S\x00\x00\x00\x04"  # the protocol's Sync message alone: what a ping sends


class FreezeAtPing(_Proxy):
    """Once armed, the first connection that sends two lone Syncs (pings) right after a COMMIT
    is frozen at the second: a transaction's connection given back to the pool is pinged by the
    store (bounded), then by sqlx; the network goes dark between the two. Connections opened
    later pass."""

    def __init__(self, host: str, port: int) -> None:
        self.armed = False
        self.tripped = threading.Event()
        super().__init__(host, port)

    def _new_connection(self) -> dict[str, bool]:
        return {"dead": False, "committed": False, "pinged": False}

    def _forward(self, data: bytes, state: dict[str, bool], upstream: bool) -> bool:
        if not upstream:
            return True
        if data == SYNC and state["committed"]:
            if state["pinged"] and self.armed:
                state["dead"] = True
                self.armed = False
                self.tripped.set()
                return False
            state["pinged"] = True
            return True
        state["committed"] = data.startswith(b"Q") and b"COMMIT\x00" in data
        state["pinged"] = False
        return True
