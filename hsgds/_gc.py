"""Python's cyclic garbage collector paused while hsgds builds many long-lived objects at once."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0  # paused regions open now, in any thread
_resume = False  # whether the collector was on when the outermost one opened


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector inside the block (also usable as a decorator). A full collection scans
    every object of the process (torch's included: 0.2-0.25 s each here), and the tens of thousands of
    entries, scenes and residency intervals of an archive's listing trigger several: at 11,636 scenes three
    full collections took 0.7 s of the 1.4-1.9 s to the first batch. What is built here holds no cycles;
    the collector is switched back on (if it was on) when the outermost paused block, in any thread, ends."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
