"""A least-recently-used cache of values made on first use: what bounds the per-scene state a loader keeps
over a collection (opened stores, label maps, sample tables) when an epoch visits thousands of scenes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

V = TypeVar("V")


class LruCache(Generic[V]):
    """``get(key, make)`` returns the value kept for ``key``, or ``make()``'s, kept from then on. The least
    recently used values are dropped (and made again if asked for again) while more than ``limit`` are
    kept, or, with ``max_bytes``, while they take more than that (each value's ``nbytes``) and more than
    ``min_count`` are kept; the value just made is always kept. Thread-safe: ``make`` runs under the
    cache's lock, so a value is never made twice at once."""

    def __init__(self, limit: int | None = None, max_bytes: int | None = None, min_count: int = 1) -> None:
        if (limit is not None and limit < 1) or (max_bytes is not None and max_bytes < 0) or min_count < 1:
            raise ValueError(f"an LruCache keeps at least 1 value and 0 bytes, got limit {limit}, "
                             f"max_bytes {max_bytes}, min_count {min_count}")
        self.limit, self.max_bytes, self.min_count = limit, max_bytes, min_count
        self._values: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0  #: bytes of the values kept (counted with ``max_bytes`` only)

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key][0]
            value = make()
            size = int(value.nbytes) if self.max_bytes is not None else 0  # type: ignore[attr-defined]
            self._values[key] = (value, size)
            self.nbytes += size
            while len(self._values) > 1 and (
                    (self.limit is not None and len(self._values) > self.limit)
                    or (self.max_bytes is not None and self.nbytes > self.max_bytes
                        and len(self._values) > self.min_count)):
                self.nbytes -= self._values.popitem(last=False)[1][1]
            return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)
