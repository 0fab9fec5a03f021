"""numba's kernels on a read-only file system (a container run with ``--read-only`` by a user without a
writable home): numba refuses to define a ``cache=True`` function when no cache folder is writable, so
hsgds puts the cache in a private folder of the temporary directory, and says what to set when even that
fails. Each case runs in a fresh interpreter in which every folder but the one named is read-only (numba's
check of a cache folder raises EROFS, as it does on such a file system)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

CHILD = r"""
import errno, json, sys
from numba.core import caching

writable = sys.argv[1]  # the one folder numba may write its cache to ("" for none)
check = caching._CacheLocator.ensure_cache_path

def read_only(self):
    if not writable or not self.get_cache_path().startswith(writable):
        raise OSError(errno.EROFS, "Read-only file system", self.get_cache_path())
    return check(self)

caching._CacheLocator.ensure_cache_path = read_only

import numba
import numpy as np
from hsgds import augment
from hsgds.engines import cpu_cut

counter = np.arange(4000, dtype=np.uint32).reshape(-1, 4)
compiled = augment._compiled_philox()
words = augment.philox4x32(counter, (7, 9))
print(json.dumps({
    "kernel": cpu_cut.available(), "reason": cpu_cut.unavailable_reason(), "cache_dir": numba.config.CACHE_DIR,
    "philox_compiled": compiled is not None,
    "cache_hits": sum(compiled.stats.cache_hits.values()) if compiled is not None else 0,
    "same_words": bool(np.array_equal(words, augment.philox4x32_numpy(counter, (7, 9)))),
}))
"""


def _child(tmp_path: Path, writable: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", CHILD, writable], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_read_only_file_system_caches_in_the_temporary_directory(tmp_path):
    folder = tmp_path / f"hsgds-numba-cache-{os.getuid()}"
    first = _child(tmp_path, str(tmp_path))
    assert first["kernel"] and first["reason"] is None
    assert first["cache_dir"] == str(folder) and first["philox_compiled"] and first["same_words"]
    assert any(folder.rglob("*.nbi")), "nothing cached"
    assert folder.stat().st_mode & 0o777 == 0o700
    second = _child(tmp_path, str(tmp_path))  # a later process loads what the first compiled
    assert second["philox_compiled"] and second["cache_hits"] >= 1 and second["same_words"]


def test_a_cache_folder_another_user_could_write_is_not_used(tmp_path):
    """numba's cache files are pickles it loads: a shared folder of that name is left alone."""
    folder = tmp_path / f"hsgds-numba-cache-{os.getuid()}"
    folder.mkdir()
    folder.chmod(0o777)
    got = _child(tmp_path, str(tmp_path))
    assert got["kernel"] and got["philox_compiled"] and got["same_words"]
    assert Path(got["cache_dir"]).parent == tmp_path and Path(got["cache_dir"]) != folder
    assert not any(folder.iterdir())


def test_nothing_writable_falls_back_and_names_the_setting(tmp_path):
    got = _child(tmp_path, "")
    assert not got["kernel"] and not got["philox_compiled"] and got["same_words"]
    assert "NUMBA_CACHE_DIR" in got["reason"] and "\n" not in got["reason"]
