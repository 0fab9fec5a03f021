"""Durable writes: fsync helpers and the atomic replace of one file, shared by the converter, ``hsgds
resplit``, ``collection.json`` and the class-map writers, so that a crash or power loss leaves either the
old file or the complete new one."""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hsgds.errors import InputError, StoreError, one_line, shown_path

__all__ = ["atomic_path", "check_writable", "fsync_dir", "fsync_file", "fsync_tree", "not_regular", "partial_path",
           "remove_stale_partials", "rename_error"]


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


def _host() -> str:
    """Where process ids mean something, as a file name may hold it: the machine's name and, on Linux, its
    pid namespace (containers sharing a host name, e.g. with --network host, each count their own pids)."""
    name = "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"
    try:
        return f"{name}_{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return name


def partial_path(target: Path) -> Path:
    """The hidden temporary a write of ``target`` goes to: ``.<name>.<host>-<pid>-<random>.partial``. Host and
    process id let a later write tell one whose writer was killed (:func:`remove_stale_partials`)."""
    return target.with_name(f".{target.name}.{_host()}-{os.getpid()}-{secrets.token_hex(4)}.partial")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: it exists
        return True
    return True


def remove_stale_partials(target: Path) -> None:
    """Delete the temporaries of earlier writes of ``target`` whose process is gone (killed by SIGKILL, the
    out-of-memory killer or a power loss: no ``finally`` ran), so that repeated kills do not fill the disk
    with hidden files (per-class probabilities take gigabytes). Only this machine's are judged: on a shared
    folder another host's process ids mean nothing here. Not on Windows, where signal 0 is no probe."""
    if os.name == "nt":
        return
    prefix = f".{target.name}.{_host()}-"
    for found in target.parent.glob(f"{glob.escape(prefix)}*.partial"):
        pid, _, _ = found.name[len(prefix):-len(".partial")].partition("-")
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                found.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, tmp_name: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it, rename it onto ``path`` and
    fsync the folder. On any exception (or KeyboardInterrupt) the temporary file is removed and ``path`` is
    untouched. ``tmp_name`` names the temporary (default :func:`partial_path`, whose stale copies left by
    killed writers are removed first)."""
    target = Path(path)
    if tmp_name is None:
        remove_stale_partials(target)
    tmp = target.with_name(tmp_name) if tmp_name else partial_path(target)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a folder ("a symbolic link", "a FIFO
    (named pipe)", ...), else None. The atomic rename of an output would replace it (a link by a file, its
    target left as it was; a pipe a reader waits on by a file), which is not what was asked for."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def check_writable(path: Path) -> None:
    """Refuse, before the work that makes it, an output file ``path`` that cannot be written: its folder is
    missing, it is a folder, it exists as something other than a regular file (a symbolic link, a FIFO, ...:
    the rename into place would replace it), or its folder is not writable (a file is created and removed
    there now: os.access says yes to root, and knows nothing of read-only mounts)."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        exists = folder.is_dir()
    except OSError as exc:  # a name longer than the file system allows (pathlib raised it from is_dir)
        raise InputError(f"cannot write {shown_path(path)}: {exc.strerror or one_line(exc)}; choose another output "
                         "path") from None
    if not exists:
        if folder.is_file():  # (it cannot be created there)
            raise InputError(f"cannot write {shown_path(path)}: {shown_path(folder)} is a file, not a folder; choose "
                             "another output path")
        raise InputError(f"cannot write {shown_path(path)}: the folder {shown_path(folder)} does not exist; create it "
                         "first")
    kind = not_regular(path)
    if kind is not None:
        raise InputError(f"cannot write {shown_path(path)}: it is {kind}, which writing would replace with a "
                         "file; choose another output path")
    if path.is_dir():
        raise InputError(f"cannot write {shown_path(path)}: it is a directory; name a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise InputError(f"cannot write {shown_path(path)}: the folder {shown_path(folder)} is not writable "
                         f"({exc.strerror}); choose "
                         "another output path") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
