"""One error hierarchy. Each class also inherits the builtin a caller would catch."""

from __future__ import annotations

__all__ = [
    "ChecksumError",
    "ConfigError",
    "DependencyError",
    "HsgdsError",
    "HsgdsWarning",
    "InputError",
    "StoreError",
    "TileReadError",
    "one_line",
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
    """Something works, but slower or weaker than it should (e.g. a format v1 store on the kvikio path)."""


def one_line(exc: BaseException) -> str:
    """Another library's error message on one line (whitespace collapsed, at most 300 characters), for
    embedding in an hsgds message."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
