"""One error hierarchy. Each class also inherits the builtin a caller would catch."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

__all__ = [
    "ChecksumError",
    "ConfigError",
    "DependencyError",
    "HsgdsError",
    "HsgdsWarning",
    "InputError",
    "StoreError",
    "TileReadError",
    "as_count",
    "as_flag",
    "as_fraction",
    "as_path",
    "control_character",
    "escaped",
    "one_line",
    "shown",
    "shown_path",
]


class HsgdsError(Exception):
    """Base of every error hsgds raises on purpose. Messages are one line and say how to fix the problem."""


class InputError(HsgdsError, ValueError):
    """A source file, option or argument is wrong (bad format, missing key, shape mismatch...)."""


class ConfigError(HsgdsError, ValueError):
    """A loader or converter setting is invalid."""


class StoreError(HsgdsError, OSError):
    """A store is missing, incomplete, of another format version, or its metadata is inconsistent."""


class TileReadError(StoreError):
    """A tile could not be read (missing, truncated, I/O error)."""


class ChecksumError(TileReadError):
    """A tile's bytes do not match the checksum recorded in the store."""


class DependencyError(HsgdsError, ImportError):
    """An optional dependency is missing; the message names the pip extra to install."""


class HsgdsWarning(UserWarning):
    """Something works, but not as the user may expect: slower or weaker than it should (a format v1 store on the
    kvikio path), or a source, split or rendering the user should know about (the converter's split, nodata,
    wavelength and georeference warnings; class names the font lacks). The CLI prints each as one line."""


def one_line(exc: BaseException, limit: int = 300, *, with_type: bool = False) -> str:
    """Another library's error message on one line (whitespace collapsed, at most ``limit`` characters), for
    embedding in an hsgds message; ``with_type``: after the exception's type name ("KeyError: 'x'"), for
    errors whose text alone says little."""
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    if with_type:
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def shown(value: object, limit: int = 60) -> str:
    """``value`` for an error message: its repr on one line and at most ``limit`` characters (numpy and torch
    wrap an array's repr over several lines); an array or tensor as its type, shape, dtype and first values."""
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and shape and hasattr(value, "dtype") and hasattr(value, "tolist"):
        kind = "numpy array" if isinstance(value, np.ndarray) else type(value).__name__  # (torch: no import here)
        size = math.prod(shape)
        # the first row's first values: no copy of a large or strided array
        first = value[(0,) * (len(shape) - 1)][:3].tolist() if size else []  # type: ignore[index]
        more = ", ..." if size > len(first) else ""
        dtype = str(value.dtype).removeprefix("torch.")  # type: ignore[attr-defined]
        text = f"{kind} of shape {tuple(shape)} {dtype} [{', '.join(map(repr, first))}{more}]"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def control_character(text: str) -> str | None:
    """The first control character (U+0000-U+001F, U+007F) in ``text`` as its escaped repr (``'\\n'``), or
    None: a name holding one would break an XML sidecar, an ENVI header's list or a one-line message."""
    return next((repr(ch) for ch in text if _is_control(ch)), None)


def not_unicode(text: str) -> str | None:
    """Why ``text`` is no Unicode text that a file can hold ("holds '\\udce9', which is no Unicode text (...)"),
    or None: an unpaired surrogate is what os.fsdecode makes of a byte that is invalid in the locale's encoding
    (a command line in another encoding), and no UTF-8 writer (GDAL, an ENVI header, a PNG) takes it."""
    surrogate = next((ch for ch in text if "\ud800" <= ch <= "\udfff"), None)
    if surrogate is None:
        return None
    return f"holds {surrogate!r}, which is no Unicode text (a byte a command line in another encoding passed on)"


def _is_control(ch: str) -> bool:
    return ch < " " or ch == "\x7f"


def escaped(text: str) -> str:
    """``text`` with its control characters escaped as a repr escapes them (``\\n``): a message that echoes a
    user's path or name stays one line on a terminal, and no escape sequence reaches it."""
    return "".join(repr(ch)[1:-1] if _is_control(ch) else ch for ch in text)


def shown_path(path: object, limit: int = 400) -> str:
    """A user-given path for an error message, on one line: control characters escaped as in a repr, and
    a path longer than ``limit`` clipped in the middle, its file name kept (the limit is well past real paths:
    a cluster's scratch folder and an EnMAP product's 90-character name are shown whole)."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    if isinstance(text, bytes):
        text = text.decode(errors="backslashreplace")
    text = escaped(text)
    if len(text) <= limit:
        return text
    name = text.rsplit("/", 1)[-1][-(limit // 2):]
    return text[:max(limit - len(name) - 3, 8)] + "..." + name


def as_path(value: object, what: str) -> Path:
    """``value`` (a str or os.PathLike) as a Path; a one-line ConfigError naming ``what`` otherwise, rather
    than pathlib's TypeError."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        return Path(value)
    raise ConfigError(f"{what} must be a path (str or os.PathLike), got {type(value).__name__} {shown(value)}")


def as_flag(value: object, what: str) -> bool:
    """``value`` (a bool, or numpy's) as a bool; a ConfigError otherwise: a string such as "no" would be true."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{what} must be True or False, got {type(value).__name__} {shown(value)}")


def as_count(value: object, what: str, minimum: int = 1) -> int:
    """``value`` (an int, or numpy's) as an int >= ``minimum``; a ConfigError otherwise (bools too)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        number = int(value)
        if number >= minimum:
            return number
    raise ConfigError(f"{what} must be an integer >= {minimum}, got {shown(value)}")


def as_fraction(value: object, what: str) -> float:
    """``value`` (a real number, or numpy's) as a float in [0, 1); a ConfigError otherwise (bools, strings and
    NaN too)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        number = float(value)
        if 0.0 <= number < 1.0:
            return number
    raise ConfigError(f"{what} must be a number in [0, 1), got {shown(value)}")
