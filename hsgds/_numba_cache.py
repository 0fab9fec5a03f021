"""Importing hsgds's numba kernels wherever numba can keep its on-disk cache."""

from __future__ import annotations

import importlib
import os
import stat
import tempfile
from pathlib import Path
from types import ModuleType

__all__ = ["NoCacheFolder", "import_kernels"]


class NoCacheFolder(ImportError):
    """numba is installed but has nowhere to keep compiled code (the message says what to set)."""


def import_kernels(module: str) -> ModuleType:
    """Import ``module``, whose functions numba compiles with ``cache=True``.

    numba refuses to define such a function when it finds no writable folder for its cache: not
    ``NUMBA_CACHE_DIR``, not the package's ``__pycache__``, not the user's cache folder. That is a
    read-only image run by a user without a writable home (``docker run --read-only``, Kubernetes'
    ``readOnlyRootFilesystem`` with an arbitrary user id). The cache then goes to a private folder in the
    temporary directory, writable in such containers (a tmpfs or an emptyDir volume), so later processes
    there load the compiled code instead of compiling it again. Raises ImportError, with what to set,
    when numba is missing, :class:`NoCacheFolder` when that folder cannot be written either.
    """
    try:
        return importlib.import_module(module)
    except RuntimeError as exc:
        if "cannot cache function" not in str(exc):
            raise
    import numba

    folder = _private_folder()
    numba.config.CACHE_DIR = str(folder)
    try:
        return importlib.import_module(module)
    except RuntimeError as exc:
        if "cannot cache function" not in str(exc):
            raise
        raise NoCacheFolder(f"numba finds no writable folder for its compiled-code cache (tried NUMBA_CACHE_DIR, "
                          f"the package folder, the user's cache folder and {folder}); set NUMBA_CACHE_DIR to a "
                          "writable folder") from None


def _private_folder() -> Path:
    """``hsgds-numba-cache-<uid>`` in the temporary directory, made if missing. numba's cache files are
    pickles that it loads and runs, so a folder another user made or could write to is never used: this
    process then takes a new folder of its own (and compiles, as without a cache)."""
    if not hasattr(os, "getuid"):  # Windows: the temporary directory is the user's own
        return Path(tempfile.gettempdir()) / "hsgds-numba-cache"
    folder = Path(tempfile.gettempdir()) / f"hsgds-numba-cache-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return folder  # not writable: numba says so
    info = os.lstat(folder)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022:
        return folder
    return Path(tempfile.mkdtemp(prefix="hsgds-numba-cache-"))
