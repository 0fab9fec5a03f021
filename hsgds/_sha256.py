"""The sha256 of a source's files, as the converter records it and as predict checks an output against it."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

__all__ = ["sha256_of"]


def sha256_of(paths: list[Path], stop: threading.Event | None = None) -> tuple[str, int]:
    """The sha256 (hex) of the files' bytes read one after another, and their total size. Once ``stop`` is set
    the reading ends at the next 1 MiB chunk with InterruptedError (a failed conversion does not wait for a
    large source to be hashed)."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    for p in paths:
        with open(p, "rb") as f:
            while n := f.readinto(buf):
                if stop is not None and stop.is_set():
                    raise InterruptedError(f"hashing {p} was stopped")
                h.update(view[:n])
                size += n
    return h.hexdigest(), size
