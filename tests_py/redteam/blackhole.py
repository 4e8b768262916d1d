"""A TCP proxy to PostgreSQL that turns into a network blackhole right after a transaction's
BEGIN: the tests of "nothing hangs" for statements inside a transaction, and for what happens to
the connection afterwards."""

from __future__ import annotations

import asyncio
import threading


class BlackholeAfterBegin:
    """TCP proxy to Postgres. Once armed, the first client packet that follows a BEGIN on a
    connection is held, and nothing more is forwarded either way (a network blackhole that starts
    right after the transaction began: BEGIN answered, the next statement never is)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = False
        self.tripped = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.writers: set[asyncio.StreamWriter] = set()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0),
                                                       self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    def dsn_for(self, dsn: str, app: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(dsn)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        query = (parts.query + "&" if parts.query else "") + f"application_name={app}"
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.port}", query=query))

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(*self.target)
        self.writers |= {cw, sw}
        state = {"began": False, "dead": False}
        await asyncio.gather(self._pump(cr, sw, state, upstream=True), self._pump(sr, cw, state, upstream=False))

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, bool], upstream: bool) -> None:
        try:
            while data := await r.read(65536):
                if state["dead"]:
                    continue  # swallowed: the blackhole
                if upstream and self.armed:
                    if state["began"]:
                        state["dead"] = True
                        self.tripped.set()
                        continue
                    if b"BEGIN" in data:
                        state["began"] = True
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
