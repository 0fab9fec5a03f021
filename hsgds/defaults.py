"""Settings: every tunable of hsgds, each with a default and an ``HSGDS_*`` environment variable.

In the style of kvikio's ``defaults``: ``defaults.get(name)`` returns a value, ``defaults.set(name=value,
...)`` overrides settings for the process, and ``with defaults.set(...):`` restores the previous values
when the block ends. A setting's environment variable is read once, the first time the setting is used
(never at import time); :func:`reload` makes the next use read the environment again. Values are checked
when read or set: a bad value, or an unknown name, is a :class:`~hsgds.errors.ConfigError`. Booleans
accept ``1/0``, ``true/false``, ``yes/no`` and ``on/off``. The table of every setting is
``docs/settings.md`` (checked against this module by ``tests/test_settings.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsgds.errors import ConfigError

__all__ = ["Setting", "default", "env_var", "get", "names", "reload", "set"]


# ---------------------------------------------------------------------------------------------- values

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError


def _integer(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError
        number = int(value)  # ValueError for text that is no integer
        if number < minimum:
            raise ValueError
        return number

    return parse


def _number(low: float, high: float, closed: bool = False) -> Callable[[Any], float]:
    """A float in the interval (low, high], or [low, high] when ``closed``."""

    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value)
        if not (low <= number if closed else low < number) or not number <= high:
            raise ValueError
        return number

    return parse


def _text(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError
    return os.fspath(value)


def _device(value: Any) -> str:
    text = _text(value).strip().lower()
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise ValueError


def _default_cache_dir() -> str:
    return str(Path.home() / ".cache" / "hsgds")


@dataclass(frozen=True)
class Setting:
    """One setting: its name, environment variable, default, and how a value is checked."""

    name: str
    env: str
    #: the value, or a function computing it when asked (``cache_dir`` depends on the user's home)
    default: Any
    #: turns a value (or the environment variable's text) into the setting's value; ValueError if it cannot
    parse: Callable[[Any], Any]
    #: what a valid value is, for error messages ("an integer >= 1")
    expects: str

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default


_SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("cache_dir", "HSGDS_CACHE_DIR", _default_cache_dir, _text, "a directory path"),
    # a CPU loader with the fused kernel starts cutting batch b+1 on the engine's threads before it hands out b
    Setting("cut_ahead", "HSGDS_CUT_AHEAD", True, _boolean, "a boolean (1/0, true/false, yes/no, on/off)"),
    Setting("device", "HSGDS_DEVICE", "auto", _device, "'auto', 'cpu', 'cuda' or 'cuda:N'"),
    # DALI engine: worker threads of its pipelines; 0 = the usable CPU cores, at most 16
    Setting("dali_threads", "HSGDS_DALI_THREADS", 0, _integer(0), "an integer >= 0 (0: automatic)"),
    # threads in kvikio's pool; 0 = KVIKIO_NTHREADS if set, else raised to min(8, CPUs) by KvikioReader
    Setting("kvikio_threads", "HSGDS_KVIKIO_THREADS", 0, _integer(0), "an integer >= 0 (0: automatic)"),
    # on the CPU the torch engine cuts with its fused numba kernel (hsgds.engines.cpu_cut) when numba imports
    Setting("numba", "HSGDS_NUMBA", True, _boolean, "a boolean (1/0, true/false, yes/no, on/off)"),
    # bfloat16 / float16 on the CPU: each tile normalized once as it lands in the ring, patches then copied
    Setting("normalize_tiles", "HSGDS_NORMALIZE_TILES", True, _boolean, "a boolean (1/0, true/false, yes/no, on/off)"),
    # the kvikio reader keeps at most this many tile files open (a least-recently-used cache of handles)
    Setting("max_open_files", "HSGDS_MAX_OPEN_FILES", 64, _integer(1), "an integer >= 1"),
    # a collection keeps at most this many scenes open (metadata, statistics, labels, sample tables)
    Setting("max_open_scenes", "HSGDS_MAX_OPEN_SCENES", 64, _integer(1), "an integer >= 1"),
    # a loader over several scenes keeps their label maps / sample sets up to this many bytes (LRU)
    Setting("sample_cache_bytes", "HSGDS_SAMPLE_CACHE_BYTES", 256 << 20, _integer(0), "a number of bytes >= 0"),
    # stderr not a terminal (a batch job's log): a progress line at most this often (and at the end); 0: every item
    Setting("progress_log_s", "HSGDS_PROGRESS_LOG_S", 30.0, _number(0.0, 86400.0, closed=True),
            "seconds in [0, 86400]"),
    # most tiles the ring reads at once (one batched read_many for kvikio, one thread each for POSIX)
    Setting("read_inflight", "HSGDS_READ_INFLIGHT", 4, _integer(1), "an integer >= 1"),
    # ring_bytes=None: the ring holds the whole split, capped to this many bytes on the CPU ...
    Setting("ring_cpu_bytes", "HSGDS_RING_CPU_BYTES", 2 << 30, _integer(1), "a number of bytes >= 1"),
    # ... and to this fraction of the free GPU memory on CUDA
    Setting("ring_gpu_fraction", "HSGDS_RING_GPU_FRACTION", 0.25, _number(0.0, 1.0), "a number in (0, 1]"),
    # seconds between checks of the stop flag while the ring's reader or consumer waits
    Setting("ring_poll_s", "HSGDS_RING_POLL_S", 0.05, _number(0.0, 60.0), "seconds in (0, 60]"),
    # torch engine, CPU path: bytes of float work per chunk of patches (a core's L2 holds it)
    Setting("torch_chunk_bytes", "HSGDS_TORCH_CHUNK_BYTES", 1 << 20, _integer(1), "a number of bytes >= 1"),
    # torch engine, CPU path: output buffers kept for reuse (the batch the caller holds, the one autograd ...)
    Setting("torch_out_pool", "HSGDS_TORCH_OUT_POOL", 4, _integer(0), "an integer >= 0"),
    # torch engine, CPU path: at most this many threads cut the chunks of one batch
    Setting("torch_threads", "HSGDS_TORCH_THREADS", 8, _integer(1), "an integer >= 1"),
    # on CUDA the torch engine cuts with its fused Triton kernel when Triton imports; off: plain torch ops
    Setting("triton", "HSGDS_TRITON", True, _boolean, "a boolean (1/0, true/false, yes/no, on/off)"),
    # every tile read is checked: crc32c on the host (POSIX), wsum64 on the device (kvikio); false: sizes only
    Setting("verify_reads", "HSGDS_VERIFY_READS", True, _boolean, "a boolean (1/0, true/false, yes/no, on/off)"),
)}

_lock = threading.Lock()
_from_env: dict[str, Any] = {}  # values read from the environment (each at its first use)
_overrides: dict[str, Any] = {}  # values given to set()
_MISSING = object()


def _setting(name: str) -> Setting:
    try:
        return _SETTINGS[name]
    except KeyError:
        raise ConfigError(f"unknown hsgds setting {name!r}; known: {', '.join(names())} "
                          "(see docs/settings.md)") from None


# ---------------------------------------------------------------------------------------------- API

def names() -> list[str]:
    """Every setting's name, sorted."""
    return sorted(_SETTINGS)


def env_var(name: str) -> str:
    """The environment variable of a setting ("device" -> "HSGDS_DEVICE")."""
    return _setting(name).env


def default(name: str) -> Any:
    """The default of a setting (what it is when neither set() nor its environment variable gives one)."""
    return _setting(name).default_value()


def given_as(name: str, value: Any) -> str:
    """How a setting's ``value`` was given, for messages: ``defaults.set(device='cpu')`` when set() gave
    it, else as its environment variable (``HSGDS_DEVICE=cpu``)."""
    if name in _overrides:
        return f"defaults.set({name}={value!r})"
    return f"{_setting(name).env}={value}"


def get(name: str) -> Any:
    """The value of a setting: a set() override, else its environment variable (read at its first use;
    empty counts as unset), else its default.

    Raises
    ------
    ConfigError
        Unknown name, or an environment variable whose value is not valid for the setting.
    """
    setting = _setting(name)
    value = _overrides.get(name, _MISSING)
    if value is not _MISSING:
        return value
    value = _from_env.get(name, _MISSING)
    if value is not _MISSING:
        return value
    with _lock:
        if name not in _from_env:
            raw = os.environ.get(setting.env)
            if raw in (None, ""):
                _from_env[name] = setting.default_value()
            else:
                try:
                    _from_env[name] = setting.parse(raw)
                except ValueError:
                    raise ConfigError(f"{setting.env}={raw!r} is not {setting.expects}; fix or unset it (see "
                                      f"docs/settings.md; default: {setting.default_value()!r})") from None
        return _from_env[name]


def reload() -> None:
    """Forget the values read from the environment: the next use of each setting reads it again (for
    programs and tests that change ``os.environ`` after hsgds has read it). set() overrides stay."""
    with _lock:
        _from_env.clear()


class set(AbstractContextManager):  # noqa: N801 - reads as a verb: defaults.set(...)
    """Override settings for the process: ``defaults.set(device="cpu", read_inflight=8)``.

    Used as a context manager (``with defaults.set(...):``), the previous values come back when the
    block ends, also when it raises; nested blocks restore in turn. Values are checked like the
    environment's (text is parsed too: ``triton="off"``).

    Raises
    ------
    ConfigError
        An unknown name or an invalid value; nothing is changed then.
    """

    def __init__(self, **values: Any) -> None:
        unknown = sorted(k for k in values if k not in _SETTINGS)
        if unknown:
            raise ConfigError(f"unknown hsgds setting(s) {unknown}; known: {', '.join(names())} "
                              "(see docs/settings.md)")
        parsed = {}
        for name, value in values.items():
            setting = _SETTINGS[name]
            try:
                parsed[name] = setting.parse(value)
            except ValueError:
                raise ConfigError(f"setting {name}={value!r} is not {setting.expects} (see "
                                  "docs/settings.md)") from None
        with _lock:
            self._previous = {k: _overrides.get(k, _MISSING) for k in parsed}
            _overrides.update(parsed)

    def __exit__(self, *exc: object) -> None:
        with _lock:
            for k, v in self._previous.items():
                if v is _MISSING:
                    _overrides.pop(k, None)
                else:
                    _overrides[k] = v
