"""A thread's state built from its stored text in one validation, without the cyclic GC paying
for it.

A long thread's load makes tens of thousands of container objects (messages, blocks, their dicts
and lists), none of them garbage. With the collector on, the young generations fill over and over
during the validation; with it merely paused, the first allocation after re-enabling collects
them all at once, and since they then survive into the oldest generation they also count towards
the next full collection, a pass over every object of the process. Profiled at 1,000 messages
that was as much time as the validation itself.

``gc.freeze()`` followed by ``gc.unfreeze()`` files every tracked object in the oldest generation
without a pass over any of them: that is where the loaded state would end up anyway, and it is
still collected there by full collections. Garbage cycles made before the load are collected
first (``gc.collect(0)``, the young generation only: a few hundred objects at most), so those are
not delayed.

Where objects are frozen already (``gc.get_freeze_count() > 0``), unfreezing would release them:
a pre-fork server's own objects, kept out of collections so its pages stay shared, and on
CPython 3.12 the interpreter's own ~375 ``__mro__``/``__bases__`` tuples of the static built-in
types, frozen at start-up (3.11 and 3.13 start with none), which every interpreter of the process
shares. There the load is filed by one collection of the young generations instead
(``gc.collect(1)``): a pass over the loaded objects, once, rather than the collections the
re-enabled collector would otherwise run over them, and nothing frozen is touched.
"""

from __future__ import annotations

import gc
from typing import TypeVar

from pydantic import BaseModel

__all__ = ["validate_stored_state"]

S = TypeVar("S", bound=BaseModel)


def validate_stored_state(state_type: type[S], text: bytes | str) -> S:
    """``state_type.model_validate_json(text)`` with the load's objects filed in the oldest GC
    generation (see the module notes). The collector is enabled again on every exit, an
    exception included, exactly when it was enabled on entry."""
    enabled = gc.isenabled()
    if enabled:
        gc.collect(0)
    gc.disable()
    try:
        state = state_type.model_validate_json(text)
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            else:
                gc.collect(1)
        return state
    finally:
        if enabled:
            gc.enable()
