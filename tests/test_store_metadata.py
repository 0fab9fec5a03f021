"""Store metadata is untrusted input: hand-crafted malicious zarr.json files and planted links must end in
a StoreError naming the problem, before anything is allocated from them or any file outside the store is
opened (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hsgds
from hsgds import format as fmt
from hsgds import scene as scene_mod
from hsgds.errors import StoreError


@pytest.fixture(scope="module")
def pristine(synthetic_store):
    return synthetic_store(30, 30, 4, classes=3, dtype="int16", seed=1, tile=18)[0]


@pytest.fixture
def store(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "s.zarr"))


def _edit(path: Path, fn) -> None:
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def _set_attr(store: Path, key: str, value) -> None:
    def put(meta):
        if value is _DELETE:
            del meta["attributes"]["hsgds"][key]
        else:
            meta["attributes"]["hsgds"][key] = value
    _edit(store / "zarr.json", put)


_DELETE = object()
_NAN = float("nan")


@pytest.mark.parametrize("key,value,message", [
    ("shape", [0, 30, 4], "shape .* three positive integers"),
    ("shape", [30, 30], "shape .* three positive integers"),
    ("shape", [30.0, 30, 4], "shape .* three positive integers"),
    ("shape", [True, 30, 4], "shape .* three positive integers"),
    ("shape", "30x30x4", "shape .* three positive integers"),
    ("shape", [-1, 30, 4], "shape .* three positive integers"),
    ("dtype", "object", "dtype = .*must be one of"),
    ("dtype", "complex64", "dtype = .*must be one of"),
    ("dtype", ["int16"], "dtype = .*must be one of"),
    ("tile", 0, "tile .* positive integer"),
    ("tile", "18", "tile .* positive integer"),
    ("tile", 1.5, "tile .* positive integer"),
    ("tile", 1_000_000, r"s.zarr: tile of \d+ bytes is not a multiple of 4096"),
    ("halo", -1, r"halo .* 0\.\.512"),
    ("halo", 10**9, r"halo .* 0\.\.512"),
    ("halo", None, r"halo .* 0\.\.512"),
    ("padding", "wrap", "unknown padding mode"),
    ("num_classes", -3, "num_classes .* non-negative"),
    ("num_samples", 10**12, "at most 900 labelled pixels"),
    ("num_samples", "450", "num_samples .* non-negative"),
    ("checksums", [1, 2, 3], "lists 3 tile checksums for 4 tiles"),
    ("checksums", [1, 2, 3, -1], "unsigned 32-bit"),
    ("checksums", [1, 2, 3, 2**32], "unsigned 32-bit"),
    ("checksums", [1, 2, 3, "4"], "unsigned 32-bit"),
    ("checksums", {"0": 1}, "checksums = .*must be a list"),
    ("wavelengths", [400.0, 500.0], "wavelengths .* 4 finite numbers"),
    ("wavelengths", [400.0, 500.0, 600.0, _NAN], "wavelengths .* 4 finite numbers"),
    ("wavelengths", [None, 500.0, "600", 700.0], r"wavelengths .* 4 finite numbers \(null for a band without a "
                                                 r"centre\) or null"),
    ("wavelengths", [None] * 4, r"wavelengths = \[None, None, None, None\] \(gives no band a centre, which is "
                                r"written as null\)"),
    ("band_names", ["a", "b", "c", 4], "band_names .* list of strings"),
    ("band_names", ["a"], "band_names .* 4 entries"),
    ("class_names", "abc", "class_names .* list of strings"),
    ("class_names", ["a"], "class_names = .*must name each of the 3 classes"),
    ("class_names", ["a", "b"], "class_names = .*must name each of the 3 classes"),
    ("class_names", ["a", "b\nc", "d"], r"class_names = .*\(the name of class 2 holds the control character '\\n'\)"),
    ("class_names", ["a", "b", "d\x7f"], "the name of class 3 holds the control character '.x7f'"),
    ("num_classes", 10**12, r"num_classes .* classes 1\.\.65535 at most"),
    ("format", "other", "format = 'other' .must be 'hsgds'"),
    ("format_version", 5, r"was written by a newer hsgds \(store format version 5; this hsgds reads versions 1 to 4\): upgrade hsgds"),
    ("format_version", 0, "has store format version 0; this hsgds reads versions 1 to 4: convert the source again"),
    ("format_version", 1, r"device_checksums = .*\(a format v1 store has none\)"),
    ("device_checksums", ["0" * 32] * 3, "lists 3 device checksums for 4 tiles"),
    ("device_checksums", ["0" * 31] * 4, "device_checksums .* 32 lowercase hex digits"),
    ("device_checksums", ["F" * 32] * 4, "device_checksums .* 32 lowercase hex digits"),
    ("device_checksums", [0, 1, 2, 3], "device_checksums .* 32 lowercase hex digits"),
    ("device_checksums", _DELETE, "device_checksums = None .must be a list"),
    ("device_checksum_algorithm", "crc32c", r"device_checksum_algorithm = 'crc32c' \(must be 'wsum64'\)"),
    ("format_version", "1", "format version '1'"),
    ("format_version", True, "format version True"),
    ("checksum_algorithm", "md5", "checksum_algorithm"),
    ("stats_split", "test", "stats_split"),
    ("source", "x", "source .* object"),
    ("tile", _DELETE, "invalid hsgds metadata"),
    ("georeference", [1, 2], "georeference .* object or null"),
    ("georeference", {"transform": [0, 1, 0, 0, 0]}, "georeference .* 6 finite numbers"),
    ("georeference", {"transform": [0, 1, 0, 0, 0, _NAN]}, "georeference .* 6 finite numbers"),
    ("georeference", {"transform": [0, 0, 0, 0, 0, -1]}, "georeference .* singular"),
    ("georeference", {"transform": [0, 1, 0, 0, 0, -1], "epsg": "4326"}, "georeference .*epsg must"),
    ("georeference", {"transform": [0, 1, 0, 0, 0, -1], "crs_wkt": ""}, "georeference .*crs_wkt must"),
    ("georeference", {"transform": [0, 1, 0, 0, 0, -1], "path": "/etc"}, "georeference .*unknown keys"),
    ("pixel_is_point", "yes", "pixel_is_point = 'yes' .must be true or false"),
    ("pixel_is_point", True, r"pixel_is_point = True .must be true or false, and false without a georeference"),
    ("nodata", [1], "nodata = .*must be an object or null"),
    ("nodata", {"value": "x", "pixels": 0, "labelled_dropped": 0, "fill": None}, "value must be a finite number"),
    ("nodata", {"value": -1, "pixels": 901, "labelled_dropped": 0, "fill": "train mean"},
     r"pixels must be an integer in 0\.\.900"),
    ("nodata", {"value": -1, "pixels": 3, "labelled_dropped": 4, "fill": "train mean"}, "cannot exceed pixels"),
    ("nodata", {"value": -1, "pixels": 3, "labelled_dropped": 0, "fill": None}, "fill must be one of .* when pixels"),
    ("nodata", {"value": -1, "pixels": 0, "labelled_dropped": 0, "fill": "train mean"}, "fill must be null"),
])
def test_invalid_root_metadata_is_a_store_error(store, key, value, message):
    if key != "format_version":  # the newest format, which may hold every field (the store is the oldest: v2)
        _set_attr(store, "format_version", fmt.FORMAT_VERSION)
    _set_attr(store, key, value)
    with pytest.raises(StoreError, match=message) as caught:
        hsgds.open_scene(store)
    assert re.search(r"; .*(convert|upgrade|install)", str(caught.value)), caught.value  # and says what to do


def test_a_band_without_a_centre_is_null_in_a_v4_store(store):
    """Format v4: a band without a centre (PRISMA's unused bands) is null among the store's wavelengths, read as
    None; a store of an older format, which has a centre for every band or none, holding one is refused."""
    _set_attr(store, "wavelengths", [None, 500.0, 600, None])
    _set_attr(store, "format_version", 4)
    assert hsgds.open_scene(store).wavelengths == [None, 500.0, 600, None]
    _set_attr(store, "format_version", 3)
    with pytest.raises(StoreError, match=r"wavelengths = \[None, 500.0, 600, None\] \(a format v3 store has a "
                                         r"centre for every band\); convert the source again"):
        hsgds.open_scene(store)


@pytest.mark.parametrize("edit, oldest", [
    ({}, 2),
    ({"nodata": {"value": -1, "pixels": 0, "labelled_dropped": 0, "fill": None}}, 3),
    ({"wavelengths": [None, 500.0, 600.0, 700.0]}, 4),
    ({"wavelengths": [None, 500.0, 600.0, 700.0], "nodata": {"value": -1, "pixels": 0, "labelled_dropped": 0,
                                                             "fill": None}}, 4),
    ({"device_checksums": None, "device_checksum_algorithm": None}, 1),
])
def test_the_oldest_version_is_the_one_each_field_needs(store, edit, oldest):
    """StoreMeta.oldest_version, which the converter records: 4 with a band without a centre, else 3 with a
    nodata record, else 2 (1 without device checksums). The metadata is valid at that version and refused, by
    the field, at the one before."""
    doc = json.loads((store / "zarr.json").read_text())["attributes"]
    doc["hsgds"].update(edit)
    known = fmt.StoreMeta.__dataclass_fields__
    assert fmt.StoreMeta(**{k: v for k, v in doc["hsgds"].items() if k in known}).oldest_version() == oldest
    doc["hsgds"]["format_version"] = oldest
    assert fmt.StoreMeta.from_json(doc, "s.zarr").format_version == oldest
    if oldest > 1:
        doc["hsgds"]["format_version"] = oldest - 1
        with pytest.raises(StoreError, match=f"a format v{oldest - 1} store has"):
            fmt.StoreMeta.from_json(doc, "s.zarr")


def test_huge_tiles_are_refused_before_allocating(store):
    """A grid whose single tile would be 64 GiB (B = 2**22 bands): refused by size, not by an allocation."""
    _set_attr(store, "shape", [30, 30, 2**22])
    _set_attr(store, "tile", 30)
    _set_attr(store, "halo", 33)
    _set_attr(store, "checksums", [0])
    with pytest.raises(StoreError, match="over the 2 GiB limit"):
        hsgds.open_scene(store)


@pytest.mark.parametrize("text,message", [
    ("[" * 100_000 + "]" * 100_000, "RecursionError"),  # nesting deeper than the parser's stack
    ("[1, 2, 3]", "not a JSON object"),
    ('{"attributes": []}', "no 'hsgds' metadata"),
    ('{"attributes": {"hsgds": [1]}}', "no 'hsgds' metadata"),
    ("{not json", "cannot read zarr.json"),
])
def test_malformed_root_json(store, text, message):
    (store / "zarr.json").write_text(text)
    with pytest.raises(StoreError, match=message):
        hsgds.open_scene(store)


def test_oversized_json_is_not_read(store, monkeypatch):
    monkeypatch.setattr(scene_mod, "MAX_JSON_BYTES", 100)
    with pytest.raises(StoreError, match="bytes, not Zarr metadata"):
        hsgds.open_scene(store)


@pytest.mark.parametrize("encoding,message", [
    ({"name": "default", "configuration": {"separator": "/../../../../etc/"}}, "invalid chunk key separator"),
    ({"name": "v2", "configuration": {"separator": "/.."}}, "invalid chunk key separator"),
    ({"name": "default", "configuration": {"separator": ""}}, "invalid chunk key separator"),
    ({"name": "default", "configuration": {"separator": 1}}, "invalid chunk key separator"),
    ({"name": "custom"}, "unsupported chunk key encoding"),
    ("default", "unsupported chunk key encoding"),
    ({"name": "default", "configuration": "/"}, "unsupported chunk key encoding"),
])
def test_chunk_key_encoding_cannot_escape(store, encoding, message):
    _edit(store / "tiles" / "zarr.json", lambda m: m.update(chunk_key_encoding=encoding))
    with pytest.raises(StoreError, match=message):
        hsgds.open_scene(store)


def test_v2_dot_encoding_is_accepted(store):
    """The other legal encoding works (the chunk files renamed to match): validation is not a blanket ban."""
    scene = hsgds.open_scene(store)
    for tid, path in enumerate(scene.tile_paths):
        ty, tx = scene.grid.tile_yx(tid)
        path.rename(store / "tiles" / f"{ty}.{tx}.0.0.0")
    _edit(store / "tiles" / "zarr.json",
          lambda m: m.update(chunk_key_encoding={"name": "v2", "configuration": {"separator": "."}}))
    assert hsgds.open_scene(store).verify() == []


def test_tile_link_outside_the_store_is_refused(store, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 4096)
    tile = hsgds.open_scene(store).tile_paths[1]
    tile.unlink()
    tile.symlink_to(secret)
    with pytest.raises(StoreError, match=r"leads through a link to .*secret.bin, outside the store"):
        hsgds.open_scene(store)


def test_tiles_folder_link_outside_the_store_is_refused(store, tmp_path):
    shutil.move(store / "tiles" / "c", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", store / "tiles" / "c")
    with pytest.raises(StoreError, match="outside the store"):
        hsgds.open_scene(store)


def test_links_inside_the_store_and_a_linked_store_are_fine(store, tmp_path):
    scene = hsgds.open_scene(store)
    a, b = scene.tile_paths[0], scene.tile_paths[1]
    b.unlink()
    b.symlink_to(a)  # inside the store: allowed, and the checksum then names the tile
    link = tmp_path / "via-link.zarr"
    link.symlink_to(store)
    problems = hsgds.open_scene(link).verify()
    assert len(problems) == 1 and "tile 1" in problems[0]


def test_inside_rejects_lexical_escapes(store):
    for bad in (store / ".." / "x", store.parent, Path("/etc/passwd")):
        with pytest.raises(StoreError, match="outside the store"):
            fmt.inside(store, bad, "test")


def test_paths_on_another_drive_are_outside_the_store(store, tmp_path, monkeypatch):
    """On Windows os.path.relpath and os.path.commonpath raise ValueError for paths on two drives; Linux has
    no drives, so they are made to fail as Windows' do. Such a path is outside the store: a StoreError, not
    a ValueError from deep inside."""
    import ntpath

    def other_drive(*args, **kwargs):
        raise ValueError("path is on mount 'D:', start on mount 'C:'")

    with monkeypatch.context() as m:
        m.setattr(os.path, "relpath", other_drive)
        with pytest.raises(StoreError, match="is outside the store"):
            fmt.inside(store, Path("/elsewhere/tile"), "test")
    # a tile that is a link to another drive
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 4096)
    tile = hsgds.open_scene(store).tile_paths[1]
    tile.unlink()
    tile.symlink_to(secret)
    with monkeypatch.context() as m:
        m.setattr(os.path, "commonpath", lambda paths: ntpath.commonpath(["C:\\store", "D:\\secret.bin"]))
        with pytest.raises(StoreError, match=r"leads through a link to .*secret.bin, outside the store"):
            hsgds.open_scene(store)


# -- the small arrays: labels, samples, statistics --------------------------------------------------------

@pytest.mark.parametrize("array,change,message", [
    ("labels", {"data_type": "object"}, "data type 'object'"),
    ("labels", {"data_type": "|O"}, "data type"),
    ("labels", {"shape": [10**6, 10**6], "chunk_grid": {"name": "regular", "configuration": {
        "chunk_shape": [10**6, 10**6]}}}, r"has shape \[1000000, 1000000\], expected \[30, 30\]"),
    ("labels", {"codecs": [{"name": "bytes", "configuration": {"endian": "big"}}]}, "raw little-endian chunk; convert"),
    ("labels", {"codecs": [{"name": "bytes"}, {"name": "gzip"}]}, "raw little-endian chunk; convert"),
    ("labels", {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "/../"}}},
     "invalid chunk key separator"),
    ("labels", {"shape": "30"}, "has shape"),
    ("samples/tile", {"shape": [10**12]}, "expected"),
])
def test_invalid_small_array_metadata(store, array, change, message):
    _edit(store / array / "zarr.json", lambda m: m.update(change))
    scene = hsgds.open_scene(store)
    with pytest.raises(StoreError, match=message):
        scene.labels if array == "labels" else scene.sample_table()


@pytest.mark.parametrize("stride", [1, 2, 4, 7, 29, 31])
def test_labels_every_is_the_strided_label_map(store, stride):
    """labels_every(s) (every s-th row read on its own, for pixels="all" with a stride) equals zarr-python's
    read of the labels array, strided."""
    import zarr

    want = zarr.open_array(str(store / "labels"), mode="r")[::stride, ::stride]
    got = hsgds.open_scene(store).labels_every(stride)  # a fresh scene: the whole map is not held
    assert got.dtype.isnative and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_labels_and_nodata_every_refuse_a_stride_below_1(store):
    """A stride of 0 or -1 read the whole map (numpy refuses [::0] and reverses the map for [::-1]), a float
    failed in range() with a TypeError: each is one line naming the stride."""
    from hsgds.errors import ConfigError

    scene = hsgds.open_scene(store)
    for stride in (0, -1, 2.0, True):
        for every in (scene.labels_every, scene.nodata_every):
            with pytest.raises(ConfigError, match=f"stride must be an integer >= 1, got {stride!r}"):
                every(stride)
    assert scene.labels_every(np.int64(4)).shape == (8, 8)  # numpy's integers are integers


def test_the_arrays_a_scene_holds_are_read_only(store):
    """labels, the sample table and the statistics are read once and the same arrays handed out each time: an
    edit in place (merging a class, centring a mean) changed what every later use of the scene read, its
    samples, pixels="all" labels, preview and predict's ground truth. They are read-only; a copy is the
    caller's."""
    import zarr

    scene = hsgds.open_scene(store)
    held = [scene.labels, *scene.sample_table().values(), *(getattr(scene.norm_stats, f) for f in fmt.STAT_FIELDS)]
    for array in held:
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0
    np.testing.assert_array_equal(scene.labels, zarr.open_array(str(store / "labels"), mode="r")[...])
    merged = scene.labels.copy()
    merged[merged == 2] = 1  # a copy is writable
    assert scene.labels_every(1) is not merged and (scene.labels == 2).any()


def test_a_scene_opened_by_a_relative_path_reads_it_after_a_chdir(store, tmp_path, monkeypatch):
    """A Scene reads its arrays on first use and its tiles on each read: opened as "s.zarr", after os.chdir
    (a notebook's %cd) it read from the new folder, another store's labels there or none at all."""
    import zarr

    want = zarr.open_array(str(store / "labels"), mode="r")[...]
    window = hsgds.open_scene(store).read(0, 30, 0, 30)
    other = Path(shutil.copytree(store, tmp_path / "elsewhere" / "s.zarr"))
    chunk = other / "labels" / "c" / "0" / "0"
    chunk.write_bytes(bytes(chunk.stat().st_size))  # the other store's labels: all 0
    monkeypatch.chdir(store.parent)
    scene = hsgds.open_scene("s.zarr")
    monkeypatch.chdir(other.parent)
    assert want.any()
    np.testing.assert_array_equal(scene.labels, want)
    np.testing.assert_array_equal(scene.read(0, 30, 0, 30), window)
    os.rename(other, tmp_path / "moved.zarr")  # and with nothing at the relative path
    np.testing.assert_array_equal(scene.read(0, 30, 0, 30), window)


def test_labels_every_refuses_a_short_label_file(store):
    chunk = store / "labels" / "c" / "0" / "0"
    with open(chunk, "r+b") as f:
        f.truncate(chunk.stat().st_size - 1)
    with pytest.raises(StoreError, match=r"labels has 1799 bytes, expected 1800"):
        hsgds.open_scene(store).labels_every(4)


def test_oversized_chunk_is_not_read(store):
    chunk = store / "labels" / "c" / "0" / "0"
    with open(chunk, "ab") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB claimed, nothing allocated unless the reader trusts it
    with pytest.raises(StoreError, match=r"labels has 1073741824 bytes, expected 1800"):
        _ = hsgds.open_scene(store).labels


@pytest.mark.parametrize("field,value,message", [
    ("tile", 99, "tile ids out of range"),
    ("y", 18, "positions outside the 18x18 tile core"),
    ("x", -1, "positions outside"),
    ("split", 9, "unknown split codes"),
    ("label", 77, r"labels outside 1\.\.3"),
])
def test_out_of_range_samples_are_refused(store, field, value, message):
    """Sample coordinates index ring slots at training time: a hostile table must not reach the gather."""
    scene = hsgds.open_scene(store)
    meta = json.loads((store / "samples" / field / "zarr.json").read_text())
    path = store / "samples" / field / fmt.chunk_key(meta, (0,))
    data = np.fromfile(path, dtype=np.dtype(meta["data_type"]).newbyteorder("<"))
    data[len(data) // 2] = value
    data.tofile(path)
    with pytest.raises(StoreError, match=message):
        scene.sample_table()
    with pytest.raises(StoreError, match=message):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, device="cpu")


def test_tiles_array_must_match_the_metadata(store):
    _edit(store / "tiles" / "zarr.json", lambda m: m.update(data_type="float64"))
    with pytest.raises(StoreError, match="not raw little-endian int16"):
        hsgds.open_scene(store)
    _edit(store / "tiles" / "zarr.json", lambda m: m.update(data_type="int16", shape=7))
    with pytest.raises(StoreError, match="tiles array has shape 7, expected .*; convert the source again"):
        hsgds.open_scene(store)


# -- any JSON at all: StoreError or a valid StoreMeta, nothing else -----------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                     lambda inner: (st.lists(inner, max_size=5)
                                    | st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                     max_leaves=12)
_VALID = {"shape": [30, 30, 4], "dtype": "int16", "tile": 18, "halo": 7, "padding": "reflect", "num_classes": 3,
          "checksums": [0, 1, 2, 3], "num_samples": 10, "format_version": 1}


@settings(max_examples=300, deadline=1000, derandomize=True, database=None)
@given(changes=st.dictionaries(st.sampled_from(sorted(fmt.StoreMeta.__dataclass_fields__)), _json, max_size=4))
def test_random_metadata_is_valid_or_a_store_error(changes):
    try:
        meta = fmt.StoreMeta.from_json({"hsgds": {**_VALID, **changes}}, "s.zarr")
    except StoreError:
        return
    grid = meta.grid  # whatever passed is usable: a sane grid, one checksum per tile
    assert grid.tile_nbytes <= fmt.MAX_TILE_BYTES and len(meta.checksums) == grid.num_tiles


@pytest.mark.parametrize("damage, message", [
    ("labels", "labels/zarr.json is missing"),
    ("samples", "samples/"),
    ("stats", "no band statistics"),
    ("nan_mean", "the train statistics .mean. are not finite"),
    ("negative_std", "the train statistics are inconsistent"),
    ("split_codes", "unknown split codes"),
])
def test_verify_reads_the_arrays_beside_the_tiles(indian_pines_store, tmp_path, run_cli, damage, message):
    """`hsgds verify` said "ok" for a store a loader then refused: labels, samples and statistics are read too."""
    import shutil

    import zarr

    store = tmp_path / "s.zarr"
    shutil.copytree(indian_pines_store, store)
    scene = hsgds.open_scene(store)
    if damage in ("labels", "samples", "stats"):
        shutil.rmtree(store / damage)
    elif damage in ("nan_mean", "negative_std"):
        field, value = ("mean", np.nan) if damage == "nan_mean" else ("std", -5.0)
        array = zarr.open_array(store / "stats" / "train" / field, mode="r+")
        values = array[:]
        values[3] = value
        array[:] = values
    else:
        split = zarr.open_array(store / fmt.split_array(scene.meta.split_generation), mode="r+")
        values = split[:]
        values[0] = 9
        split[:] = values
    code, out, err = run_cli("verify", store)
    assert code == 2 and re.search(message, err) and "in its labels, samples, statistics or nodata map" in err, err
    assert "Traceback" not in err and "tiles are damaged" not in err


def test_verify_names_a_tile_that_is_a_fifo_and_returns(store, tmp_path):
    """`hsgds verify` hung for ever on a tile chunk replaced by a FIFO (open(2) waits for a writer); now the
    tile is named, the others are checked, exit 2. Run as a subprocess: a hang must not hang the suite."""
    import subprocess
    import sys

    path = hsgds.open_scene(store).tile_paths[1]
    path.unlink()
    os.mkfifo(path)
    code = "import sys; from hsgds.cli import main; main(sys.argv[1:])"
    try:
        proc = subprocess.run([sys.executable, "-c", code, "verify", str(store)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("hsgds verify hung on a FIFO planted as a tile chunk")
    assert proc.returncode == 2, proc.stderr
    assert f"tile 1 ({path}) is a FIFO, not a chunk file" in proc.stderr
    assert "1 of 4 tiles are damaged" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("field", ["y", "x"])
def test_samples_in_the_padding_of_an_edge_tile_are_refused(store, run_cli, field):
    """An edge tile's core runs past the scene (30 = 18 + 12: rows and columns 30..35 of the last tiles are
    filler). A sample placed there passed the tile-core check: `hsgds verify` said "ok", then `hsgds info`
    and `hsgds preview` ended in an IndexError traceback. It is a listed problem now, and a one-line error."""
    meta = json.loads((store / "samples" / field / "zarr.json").read_text())
    path = store / "samples" / field / fmt.chunk_key(meta, (0,))
    data = np.fromfile(path, dtype=np.dtype(meta["data_type"]).newbyteorder("<"))
    tile = np.fromfile(store / "samples" / "tile" / "c" / "0", dtype="<i4")
    i = int(np.nonzero(tile == 3)[0][0])  # a sample of the bottom-right tile, whose core ends at 36 > 30
    data[i] = 17  # inside the 18x18 core, outside the scene
    data.tofile(path)
    ty, tx = divmod(3, 2)
    assert (ty if field == "y" else tx) * 18 + 17 >= 30  # the reference: this is no pixel of the scene
    code, _, err = run_cli("verify", store)
    assert code == 2 and "positions outside the 30x30 scene" in err and "Traceback" not in err, err
    code, _, err = run_cli("info", store)
    assert code == 2 and err.count("\n") == 1 and "positions outside the 30x30 scene" in err, err


@pytest.mark.parametrize("damage", ["labels_other_class", "labels_cleared", "labels_added", "sample_label"])
def test_verify_names_labels_and_samples_that_disagree(store, run_cli, damage):
    """The label map and the sample table have no checksum; a loader takes labelled samples from the table
    and `pixels="all"` labels (and predict's ground truth) from the map. A byte changed in either, within the
    class range, passed: `hsgds verify` said "ok". The two are compared now (against zarr-python's reads)."""
    import zarr

    labels = zarr.open_array(store / "labels", mode="r+")
    table = {f: zarr.open_array(store / "samples" / f, mode="r+") for f in ("tile", "y", "x", "label")}
    ref = labels[:]
    ty, tx = np.divmod(table["tile"][:].astype(np.int64), 2)
    sy, sx = ty * 18 + table["y"][:], tx * 18 + table["x"][:]
    assert np.array_equal(ref[sy, sx], table["label"][:]) and np.count_nonzero(ref) == len(sy)  # intact
    code, out, _ = run_cli("verify", store)
    assert code == 0 and out.startswith("ok:")
    y, x, k = int(sy[0]), int(sx[0]), int(table["label"][0])
    if damage == "labels_other_class":
        ref[y, x] = k % 3 + 1
    elif damage == "labels_cleared":
        ref[y, x] = 0
    elif damage == "labels_added":
        ref[tuple(np.argwhere(ref == 0)[0])] = 1
    if damage == "sample_label":
        values = table["label"][:]
        values[0] = k % 3 + 1
        table["label"][:] = values
    else:
        labels[:] = ref
    code, _, err = run_cli("verify", store)
    assert code == 2 and "the labels and the samples disagree" in err and "Traceback" not in err, err


@pytest.mark.parametrize("key, value, message", [
    ("num_classes", 10**12, r"num_classes = 1000000000000 \(a store holds classes 1\.\.65535 at most\)"),
    ("class_names", ["a"], r"class_names = \['a'\] \(must name each of the 3 classes\)"),
])
def test_class_fields_that_break_reports_are_refused_on_open(store, run_cli, key, value, message):
    """A store whose num_classes was huge, or whose class names fewer than its classes, verified "ok"; then
    `hsgds info` ended in a traceback (MemoryError sizing a per-class table; IndexError naming a class). The
    converter never writes either (a class id is at most 65535, every class is named when names are given):
    refused on open."""
    _set_attr(store, key, value)
    for command in ("verify", "info"):
        code, out, err = run_cli(command, store)
        assert code == 2 and not out and err.count("\n") == 1 and re.search(message, err), (command, err)



def test_more_class_names_than_classes_still_open(store):
    """An unlabelled scene converted by `convert-many --class-names` keeps the collection's names with no class
    of its own (num_classes 0): more names than classes is a valid store."""
    _set_attr(store, "class_names", ["a", "b", "c", "d"])
    assert hsgds.open_scene(store).class_names == ["a", "b", "c", "d"]
    _set_attr(store, "num_classes", 0)
    assert hsgds.open_scene(store).num_classes == 0


def test_missing_train_statistics_are_named_not_replaced_by_every_pixels(store, run_cli):
    """A store recording a train split (stats_split "train") whose stats/train was lost verified "ok", and a
    loader silently normalized with stats/all, every pixel's statistics (test pixels included). Both refuse
    it now, naming the missing group."""
    import torch

    scene = hsgds.open_scene(store)
    assert scene.meta.stats_split == "train" and scene.stats["all"] is not None
    shutil.rmtree(store / "stats" / "train")
    code, _, err = run_cli("verify", store)
    assert code == 2 and "the train statistics (stats/train) are missing" in err and "Traceback" not in err, err
    with pytest.raises(StoreError, match=r"the train statistics \(stats/train\) are missing, though the store "
                                         r"records a train split; convert the source again"):
        hsgds.PatchLoader(store, patch_size=3, batch_size=4, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("change, message", [
    (lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[1, 1, 32, 32, 2]),
     r"declares the chunk grid .*, not regular chunks of one tile \[1, 1, 32, 32, 4\]"),
    (lambda m: m.update(chunk_grid="regular"), r"declares the chunk grid regular, not regular chunks of one tile"),
    (lambda m: m["chunk_grid"].update(name="rectilinear"), r"declares the chunk grid .*rectilinear.*, not regular chunks of one tile"),
    (lambda m: m.update(node_type="group"), r"is not a Zarr v3 array \(zarr_format 3, node_type group\)"),
    (lambda m: m.update(zarr_format=2), r"is not a Zarr v3 array \(zarr_format 2, node_type array\)"),
    (lambda m: m.update(storage_transformers=[{"name": "sharding"}]), r"declares storage transformers"),
])
def test_tiles_zarr_json_must_describe_the_chunk_files(store, run_cli, change, message):
    """`hsgds verify` said "ok" for a store whose tiles/zarr.json another tool had edited (chunks of half a
    tile, a group, Zarr v2, a storage transformer): the runtime reads each whole-tile file regardless, but
    zarr-python, which the format promises can open the store, then fails or reads other values. The tiles'
    zarr.json must describe the files the runtime reads, or the store is refused in one line."""
    import zarr

    np.asarray(zarr.open_array(store / "tiles", mode="r")[0, 0])  # the reference reads the intact store
    _edit(store / "tiles" / "zarr.json", change)
    with pytest.raises(Exception):  # noqa: B017,PT011 - zarr-python's own errors vary by the edit
        np.asarray(zarr.open_array(store / "tiles", mode="r")[0, 0])
    code, out, err = run_cli("verify", store)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert re.search(r"s\.zarr: the tiles array.s zarr\.json " + message + ".*; convert the source again$", err), err


@pytest.mark.parametrize("name, message", [
    ("zarr.json", "cannot read zarr.json"),
    ("tiles/zarr.json", "cannot read tiles/zarr.json"),
    ("labels/zarr.json", "cannot read labels/zarr.json"),
])
def test_a_zarr_json_that_is_a_fifo_is_named_not_waited_on(store, name, message):
    """A zarr.json replaced by a FIFO hung `hsgds verify` (and info, and any loader) for ever: reading it
    waits for a writer. It is read non-blocking now and named in one line. In a subprocess: a hang must not
    hang the suite."""
    import subprocess
    import sys

    (store / name).unlink()
    os.mkfifo(store / name)
    code = "import sys; from hsgds.cli import main; main(sys.argv[1:])"
    try:
        proc = subprocess.run([sys.executable, "-c", code, "verify", str(store)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hsgds verify hung on a FIFO planted as {name}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{store}: {message} (ValueError: it is a FIFO, not a file); convert the source again" in proc.stderr


def test_a_collection_json_that_is_a_fifo_is_named_not_waited_on(tmp_path):
    """open_collection read collection.json with a blocking read: a FIFO there hung every loader over it."""
    import threading

    from hsgds.collection import open_collection

    fifo = tmp_path / "collection.json"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def run():
        try:
            open_collection(fifo)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked read, then fail
        thread.join(20)
        pytest.fail("open_collection blocked on a FIFO planted as collection.json")
    assert isinstance(caught[0], StoreError), caught
    assert str(caught[0]) == (f"{fifo}: cannot read it (ValueError: it is a FIFO, not a file); write it again with "
                              "`hsgds convert-many`")


def _flip_bit(path: Path, byte: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= 1 << bit
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["train_mean_exponent", "all_std_mantissa", "train_min", "all_max_lowest_bit",
                                    "split_train_to_test"])
def test_verify_names_statistics_that_are_not_those_of_the_tiles(store, run_cli, damage):
    """The statistics and split codes have no checksum. One flipped bit in stats/train/mean (band 1 doubled or halved)
    verified "ok" and shifted band 1 of every training patch by many standard deviations; so did a flipped split
    code moving a test pixel into train (train statistics no longer those of the train pixels). `hsgds verify`
    now recomputes both groups from the tiles it reads and names a group that differs."""
    scene = hsgds.open_scene(store)
    cube = scene.read(0, 30, 0, 30).reshape(-1, 4).astype(np.float64)  # the reference: plain numpy
    y, x, _ = scene.samples("train")
    train = scene.read(0, 30, 0, 30)[y, x].astype(np.float64)
    for group, pixels in (("train", train), ("all", cube)):
        st = scene.stats[group]
        assert np.allclose(st.mean, pixels.mean(0), rtol=1e-12) and np.allclose(st.std, pixels.std(0), rtol=1e-12)
        assert np.array_equal(st.min, pixels.min(0)) and np.array_equal(st.max, pixels.max(0))
    code, out, _ = run_cli("verify", store)
    assert code == 0 and out.startswith("ok:")
    group = "all" if damage.startswith("all") else "train"
    if damage == "train_mean_exponent":
        _flip_bit(store / "stats" / "train" / "mean" / "c" / "0", 8 + 6, 4)  # band 1's lowest exponent bit: doubled or halved
    elif damage == "all_std_mantissa":
        _flip_bit(store / "stats" / "all" / "std" / "c" / "0", 8 * 2 + 6, 0)  # band 2: about 1 part in 16
    elif damage == "train_min":
        _flip_bit(store / "stats" / "train" / "min" / "c" / "0", 8 * 3 + 5, 0)
    elif damage == "all_max_lowest_bit":  # a pixel value no more: min and max are compared exactly
        _flip_bit(store / "stats" / "all" / "max" / "c" / "0", 0, 0)
    else:
        codes_path = store / fmt.split_array(0) / "c" / "0"
        codes = np.fromfile(codes_path, dtype=np.uint8)
        i = int(np.nonzero(codes == fmt.SPLIT_TRAIN)[0][0])
        _flip_bit(codes_path, i, 1)  # train (1) -> test (3)
    st = hsgds.open_scene(store).stats[group]
    assert all(np.all(np.isfinite(getattr(st, f))) for f in fmt.STAT_FIELDS) and np.all(st.std >= 0)
    code, _, err = run_cli("verify", store)
    assert code == 2 and f"the {group} statistics differ from those of the tiles" in err, err
    # a flipped code is also named by the split check (the store's random split fixes each class's counts)
    flipped = damage == "split_train_to_test"
    assert flipped == ("the split codes (samples/split) are not the recorded random split's" in err), err
    assert "Traceback" not in err and "tiles are damaged" not in err and err.count("\n") == 2 + flipped, err


# -- metadata damage an adversarial hunt found `hsgds verify` passing -------------------------------------------

@pytest.fixture(scope="module")
def split_stores(synthetic_store):
    """Stores with val and test pixels: a random split, and a block split on 8x8 blocks (guard 1)."""
    return {"random": synthetic_store(30, 30, 4, classes=3, seed=1, tile=18, train=0.2, val=0.2)[0],
            "blocks": synthetic_store(48, 48, 4, classes=3, seed=2, max_patch=3, split="blocks", train=0.3, val=0.2,
                                      block_size=8)[0]}


def _zarr_attrs(store: Path) -> dict:
    import zarr

    return dict(zarr.open_group(store, mode="r").attrs["hsgds"])


def _set_attrs(store: Path, **changes) -> None:
    """Edit the root group's hsgds attributes with zarr-python (another tool's edit, not hsgds's)."""
    import zarr

    group = zarr.open_group(store, mode="r+")
    group.attrs["hsgds"] = {**dict(group.attrs["hsgds"]), **changes}


@pytest.mark.parametrize("method", ["random", "blocks"])
@pytest.mark.parametrize("flip", [(fmt.SPLIT_TEST, fmt.SPLIT_VAL), (fmt.SPLIT_VAL, fmt.SPLIT_TEST)],
                         ids=["test_to_val", "val_to_test"])
def test_verify_names_split_codes_flipped_between_val_and_test(split_stores, tmp_path, run_cli, method, flip):
    """A split code flipped between val and test moves no train pixel, so no statistic changes: `hsgds verify`
    said "ok" while the test scores were taken on other pixels. The store records its split (method, amounts,
    seed; a block split its grid and guard loss), which fixes a random split's per-class counts and gives each
    block one split: the codes are checked against it, and the `hsgds resplit` named makes the same split again."""
    import shlex

    import zarr

    store = Path(shutil.copytree(split_stores[method], tmp_path / "s.zarr"))
    code, out, err = run_cli("verify", store)
    assert code == 0 and out.startswith("ok:"), err
    meta = _zarr_attrs(store)
    split = zarr.open_array(store / "samples" / "split", mode="r+")
    codes = split[:]
    original = codes.copy()
    # scene positions of the samples, from the tile ids and tile-core positions (plain numpy)
    tile_id = zarr.open_array(store / "samples" / "tile", mode="r")[:].astype(np.int64)
    ntx = -(-meta["shape"][1] // meta["tile"])
    sy = tile_id // ntx * meta["tile"] + zarr.open_array(store / "samples" / "y", mode="r")[:]
    sx = tile_id % ntx * meta["tile"] + zarr.open_array(store / "samples" / "x", mode="r")[:]
    old, new = flip
    candidates = np.flatnonzero(codes == old)
    if method == "blocks":  # a pixel whose block holds another of its split: one pixel flipped mixes that block
        bs, (oy, ox) = meta["split"]["block_size"], meta["split"]["block_origin"]
        block = (sy - oy) // bs * 1000 + (sx - ox) // bs
        candidates = [i for i in candidates if np.count_nonzero((block == block[i]) & (codes == old)) > 1]
    i = int(candidates[0])
    codes[i] = new
    split[:] = codes
    code, out, err = run_cli("verify", store)
    assert code == 2 and not out and "Traceback" not in err, err
    what = {"random": "random split's (train 0.2, val 0.2 of each class): 1 class differ",
            "blocks": "block split's (1 block of its 8x8 grid (origin [0, 0]) holds pixels of two splits)"}[method]
    assert f"the split codes (samples/split) are not the recorded {what}" in err, err
    assert "1 problem in its labels, samples, statistics or nodata map" in err and "tiles are damaged" not in err
    command = re.search(r"run `(hsgds resplit [^`]*)` \(the recorded split again\) or convert the source again", err)
    assert command, err
    code, _, err = run_cli(*shlex.split(command.group(1))[1:])
    assert code == 0, err
    code, out, err = run_cli("verify", store)
    assert code == 0 and out.startswith("ok:"), err
    generation = _zarr_attrs(store)["split_generation"]
    assert np.array_equal(zarr.open_array(store / fmt.split_array(generation), mode="r")[:], original)


@pytest.mark.parametrize("changes, message", [
    ({"num_classes": 4}, r"the metadata records 4 classes, but the labels hold classes up to 3 and no class is named "
                         r"\(num_classes was changed since the conversion\)"),
    ({"num_classes": 2}, r"labels hold class 3 but the store has 2 classes"),
])
def test_verify_names_a_class_count_the_labels_do_not_hold(store, run_cli, changes, message):
    """`num_classes` raised above every class the labels hold or the names name verified "ok"; a model built
    from it gets output units no pixel trains, and reports list classes that do not exist. The converter
    records the largest of the labels' classes and the names' count: verify compares the two (a count below
    the largest label was named already; names fewer than the count are refused on open)."""
    import zarr

    labels = zarr.open_array(store / "labels", mode="r")[:]
    assert labels.max() == 3 and _zarr_attrs(store)["num_classes"] == 3  # the reference
    _set_attrs(store, **changes)
    code, out, err = run_cli("verify", store)
    assert code == 2 and not out and re.search(message, err) and "Traceback" not in err, err
    assert "in its labels, samples, statistics or nodata map; convert the source again" in err, err


def test_verify_passes_class_names_that_outnumber_the_labels(store, run_cli):
    """Names may outnumber a scene's classes (a collection's shared names): num_classes is then their count."""
    _set_attrs(store, num_classes=5, class_names=list("abcde"))
    code, out, err = run_cli("verify", store)
    assert code == 0 and out.startswith("ok:"), err


def test_verify_names_missing_whole_scene_statistics(store, run_cli):
    """A store whose stats/all was deleted verified "ok", and a loader sized its output range from the train
    statistics instead, silently. The converter writes them for every scene with data: verify names them."""
    import zarr

    assert "all" in zarr.open_group(store / "stats", mode="r")
    del zarr.open_group(store / "stats", mode="r+")["all"]
    assert hsgds.open_scene(store).stats["all"] is None
    code, out, err = run_cli("verify", store)
    assert code == 2 and not out and "Traceback" not in err, err
    assert f"hsgds: bad array: {store}: the whole-scene statistics (stats/all) are missing; convert the source again" \
        in err, err
    assert "1 problem in its labels, samples, statistics or nodata map; convert the source again" in err, err


def test_split_counts_of_stores_split_before_the_exact_rounding_are_recognised():
    """verify checks a random split's per-class counts against the record; stores split before 2026-12-03
    rounded a fraction as floor(f * n + 0.5) in floating point, which differs for about 1 in 50 two-decimal
    halves: those counts are the older rule's, not damage."""
    counts = np.array([50, 7, 2, 1])
    exact = fmt.random_split_sizes(counts, 0.29, 0)
    older = fmt.random_split_sizes(counts, 0.29, 0, float_rounding=True)
    assert exact[0].tolist() == [15, 2, 1, 1] and older[0].tolist() == [14, 2, 1, 1]  # 0.29 * 50 == 14.4999...
    assert exact[1].tolist() == older[1].tolist() == [0, 0, 0, 0]
