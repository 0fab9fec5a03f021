"""Format v2 from the converter: wsum64 device checksums beside crc32c, `hsgds verify` checking both, v1
stores still read, and every file and folder of a store synced to disk before it is renamed into place."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

import hsgds
from hsgds import checksum
from hsgds import format as fmt


def _copy(store, tmp_path):
    out = tmp_path / "copy.zarr"
    shutil.copytree(store, out)
    return out


def _edit_meta(store, change):
    path = store / "zarr.json"
    doc = json.loads(path.read_text())
    change(doc["attributes"][fmt.FORMAT_NAME])
    path.write_text(json.dumps(doc))


def test_verify_checks_the_device_checksums_too(tile_store, tmp_path, run_cli):
    store = _copy(tile_store, tmp_path)
    code, out, _ = run_cli("verify", store)
    assert code == 0 and "(crc32c and wsum64)" in out

    def wrong_wsum(meta):  # crc32c still right, the device checksum of tile 3 not
        s, p = checksum.decode(meta["device_checksums"][3])
        meta["device_checksums"][3] = checksum.encode((s, p ^ 1))

    _edit_meta(store, wrong_wsum)
    code, _, err = run_cli("verify", store)
    assert code == 2 and "tile 3 (" in err and "fails its wsum64 checksum" in err and "1 of 12 tiles" in err


def test_format_v1_store_still_reads_and_verifies(tile_store, tmp_path, run_cli, zarr_tile):
    store = _copy(tile_store, tmp_path)

    def to_v1(meta):
        meta["format_version"] = 1
        del meta["device_checksums"], meta["device_checksum_algorithm"]

    _edit_meta(store, to_v1)
    scene = hsgds.open_scene(store)
    assert scene.meta.format_version == 1 and scene.meta.device_checksums is None
    code, out, _ = run_cli("verify", store)
    assert code == 0 and "a format v1 store has no device checksums" in out
    with hsgds.PatchLoader(store, patch_size=5, batch_size=64, split=None, device="cpu") as loader:
        assert sum(len(p) for p, _ in loader) == scene.meta.num_samples  # the POSIX path never warns

    def v1_with_device_sums(meta):
        meta["device_checksums"] = ["0" * 32] * 12

    _edit_meta(store, v1_with_device_sums)
    with pytest.raises(hsgds.StoreError, match=r"device_checksums = .*\(a format v1 store has none\)"):
        hsgds.open_scene(store)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names synced descriptors via /proc/self/fd")
def test_every_file_and_folder_is_synced_before_the_rename(npy_scene, tmp_path, monkeypatch):
    from hsgds.preprocess import convert as conv

    cp, lp, _, _ = npy_scene(h=40, w=36, b=8)
    synced, renamed = [], []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def rename(src, dst):
        renamed.append((str(src), str(dst), len(synced)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(conv.os, "rename", rename)
    out = conv.convert(cp, tmp_path / "s.zarr", conv.ConvertOptions(labels=lp, max_patch=5, tile=12))
    final = [r for r in renamed if r[1] == str(out)]
    assert len(final) == 1
    tmp, _, synced_before = final[0]
    everything = {tmp} | {os.path.join(d, n) for d, dirs, files in os.walk(out) for n in dirs + files}
    everything = {p.replace(str(out), tmp) for p in everything}
    assert everything <= set(synced[:synced_before]), sorted(everything - set(synced[:synced_before]))[:5]
    assert str(out.parent) in synced[synced_before:]  # and the rename itself
