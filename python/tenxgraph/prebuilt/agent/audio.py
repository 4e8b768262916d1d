"""AudioAgent: 10xGraph's realtime (audio-to-audio) agent. tenxgraph does not provide realtime
audio (issue 15 leaves audio out): the name imports, so a module that only imports it loads,
and constructing it raises :class:`PrebuiltNotSupportedError` (``PREBUILT_003``)."""

from __future__ import annotations

from typing import Any

from tenxgraph.prebuilt.errors import PrebuiltNotSupportedError

__all__ = ["AudioAgent"]


class AudioAgent:
    """Not supported: constructing it raises :class:`PrebuiltNotSupportedError` (a
    ``NotImplementedError``, ``PREBUILT_003``) before anything else happens. Use
    :class:`ReactAgent` for text agents."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise PrebuiltNotSupportedError(
            "AudioAgent (realtime audio-to-audio) is not supported by tenxgraph: realtime audio is out of scope; "
            "use ReactAgent for a text agent (docs/migrating-from-10xgraph.md, Prebuilt agents and tools)",
            context={"name": "AudioAgent"})
