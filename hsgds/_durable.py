"""Durable writes: fsync helpers and the atomic replace of one file, shared by the converter, ``hsgds
resplit``, ``collection.json`` and the class-map writers, so that a crash or power loss leaves either the
old file or the complete new one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from hsgds.errors import StoreError

__all__ = ["atomic_path", "fsync_dir", "fsync_file", "fsync_tree", "rename_error"]


def fsync_file(path: str | os.PathLike) -> None:
    """Flush one file's contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename, a new file) to disk, where the platform can: Windows cannot open a
    folder and some file systems cannot sync one; the files themselves are synced either way."""
    if os.name == "nt":
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """fsync every file under ``root`` whose path is not in ``skip`` (files already synced as written), then
    every folder, ``root`` included."""
    for folder, _, files in os.walk(os.fspath(root), topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if path not in skip:
                fsync_file(path)
        fsync_dir(folder)


def rename_error(exc: OSError, action: str, retry: str) -> StoreError:
    """The one-line error for a rename or replace that failed (``action``: "move the new store into X").
    On Windows a file or folder that another process holds open cannot be renamed or replaced
    (PermissionError); ``retry`` says what to run again."""
    if isinstance(exc, PermissionError):
        hint = ("close the programs that have it open (on Windows an open file cannot be replaced) and check "
                f"that its folder is writable, then {retry}")
    else:
        hint = f"check the disk, then {retry}"
    return StoreError(f"cannot {action} ({exc.strerror or exc}); {hint}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, tmp_name: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it, rename it onto ``path`` and
    fsync the folder. On any exception (or KeyboardInterrupt) the temporary file is removed and ``path`` is
    untouched. ``tmp_name`` names the temporary (default ``.<name>.<pid>-<random>.partial``)."""
    target = Path(path)
    tmp = target.with_name(tmp_name or f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)
