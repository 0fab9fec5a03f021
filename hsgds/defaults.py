"""Settings with defaults, each backed by an ``HSGDS_*`` environment variable (read when asked, never at
import time). Use ``defaults.get(name)``, ``defaults.set(name, value)``, or ``with defaults.set(...):``.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from hsgds.errors import ConfigError

def _default_cache_dir() -> str:
    return str(Path.home() / ".cache" / "hsgds")


# name -> (environment variable, default (a value, or a function computing it when asked), parser)
_SETTINGS: dict[str, tuple[str, Any, Any]] = {
    "cache_dir": ("HSGDS_CACHE_DIR", _default_cache_dir, str),
    "device": ("HSGDS_DEVICE", "auto", str),
    # threads in kvikio's pool; 0 = KVIKIO_NTHREADS if set, else raised to min(8, CPUs) by KvikioReader
    "kvikio_threads": ("HSGDS_KVIKIO_THREADS", 0, int),
    # 1: the torch engine uses its fused Triton kernel on CUDA when Triton imports; 0: plain torch ops
    "triton": ("HSGDS_TRITON", 1, int),
}
_overrides: dict[str, Any] = {}


def names() -> list[str]:
    return sorted(_SETTINGS)


def env_var(name: str) -> str:
    return _SETTINGS[name][0]


def default(name: str) -> Any:
    value = _SETTINGS[name][1]
    return value() if callable(value) else value


def get(name: str) -> Any:
    """The value of a setting: set() override, else its environment variable, else the default."""
    if name not in _SETTINGS:
        raise KeyError(f"unknown hsgds setting {name!r}; known: {', '.join(names())}")
    if name in _overrides:
        return _overrides[name]
    var, _, parse = _SETTINGS[name]
    raw = os.environ.get(var)
    if raw in (None, ""):
        return default(name)
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {parse.__name__}; unset it or see docs/settings.md "
                          f"(default: {default(name)!r})") from None


class set(AbstractContextManager):  # noqa: N801 - reads as a verb: defaults.set(...)
    """Override settings for the process; as a context manager, restore the previous values on exit."""

    def __init__(self, **values: Any) -> None:
        unknown = [k for k in values if k not in _SETTINGS]
        if unknown:
            raise KeyError(f"unknown hsgds setting(s) {unknown}; known: {', '.join(names())}")
        self._previous = {k: _overrides.get(k, _MISSING) for k in values}
        _overrides.update(values)

    def __exit__(self, *exc: object) -> None:
        for k, v in self._previous.items():
            if v is _MISSING:
                _overrides.pop(k, None)
            else:
                _overrides[k] = v


_MISSING = object()
