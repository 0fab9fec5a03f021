"""Rewriting a complete store's root metadata in place: ``hsgds resplit`` (a new split generation) and
``hsgds convert-many`` (new class names, the tiles kept).

The ``hsgds`` attribute of the root ``zarr.json`` is what marks a store complete, so it is never edited where it
lies: the whole document is written to a temporary file beside it, synced, and renamed over it (the commit
point), then the folder is synced. A reader sees the old metadata or the new, never part of either; a writer
killed before the rename leaves the store as it was, plus a hidden temporary that the next rewrite removes.
Rewriters exclude each other with an advisory lock (``flock``) on the store folder, held while they read,
compute and commit, so that neither writes back metadata the other has since replaced; Windows has none
(docs/windows.md).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from pathlib import Path

from hsgds import format as fmt
from hsgds._durable import atomic_path, rename_error
from hsgds.errors import InputError, StoreError, one_line
from hsgds.preprocess.convert import lock_folder, write_error

__all__ = ["commit_metadata", "lock_store", "remove_stale_commits"]

#: the temporaries a rewrite writes the new zarr.json to (``resplit-``: as hsgds named them before class
#: names could be rewritten; a killed writer's are removed by the next rewrite)
_TMP_PREFIXES = (".zarr.json.new-", ".zarr.json.resplit-")


def lock_store(path: Path) -> int | None:
    """Exclusive advisory lock on the store folder, held until the returned descriptor is closed (None where
    the platform has none)."""
    try:
        return lock_folder(path)
    except OSError:
        raise InputError(f"another `hsgds resplit` or `hsgds convert-many` is rewriting {path}; wait for it to "
                         "finish") from None


def remove_stale_commits(store: Path) -> None:
    """Delete the temporaries of rewrites that were killed before their rename (call with the lock held: no
    rewrite is then writing one)."""
    for prefix in _TMP_PREFIXES:
        for tmp in store.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):  # a leftover is harmless; the next rewrite tries again
                tmp.unlink()


def commit_metadata(store: Path, meta: fmt.StoreMeta, retry: str) -> None:
    """Replace the store's ``hsgds`` metadata by ``meta`` in one atomic rename (the rest of zarr.json kept);
    ``retry`` says what to run again should it fail (one-line StoreError)."""
    root_json = store / "zarr.json"
    try:
        doc = json.loads(root_json.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise StoreError(f"{store}: cannot read zarr.json ({one_line(exc)}); convert the source again") from None
    doc.setdefault("attributes", {})[fmt.FORMAT_NAME] = meta.to_json()
    try:
        with atomic_path(root_json, f"{_TMP_PREFIXES[0]}{secrets.token_hex(4)}") as tmp, open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
    except PermissionError as exc:  # on Windows: a program reading the store holds zarr.json open
        raise rename_error(exc, f"replace {root_json}", retry) from None
    except OSError as exc:
        raise write_error(exc, f"the new metadata of {store}", retry,
                          f"the store is not writable: check its permissions, then {retry}") from None
