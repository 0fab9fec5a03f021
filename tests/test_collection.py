"""open_collection / Collection / write_collection: metadata from collection.json, stores opened lazily."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import zarr

import hsgds
from hsgds.collection import COLLECTION_FILE, SceneEntry, open_collection, write_collection
from hsgds.errors import ConfigError, StoreError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.scene import open_scene


@pytest.fixture(scope="module")
def three_stores(tmp_path_factory):
    """Three converted seeded scenes (different sizes and band counts) in one folder."""
    from hsgds.synthetic import make_scene

    root = tmp_path_factory.mktemp("coll")
    out = []
    for i, (h, w, b) in enumerate([(20, 17, 5), (31, 12, 8), (9, 25, 5)]):
        cube, labels = make_scene(h, w, b, classes=3, seed=i)
        np.save(root / f"c{i}.npy", cube)
        np.save(root / f"g{i}.npy", labels)
        out.append(convert(root / f"c{i}.npy", root / f"s{i}.zarr",
                           ConvertOptions(labels=root / f"g{i}.npy", class_names=("a", "b", "c"), max_patch=5)))
    return root, out


def _write(root, stores):
    entries = [SceneEntry.of_scene(f"scene{i}", open_scene(p)) for i, p in enumerate(stores)]
    return write_collection(root, entries)


def test_round_trip_matches_each_store(three_stores):
    root, stores = three_stores
    file = _write(root, stores)
    assert file == root / COLLECTION_FILE
    assert not [p for p in root.iterdir() if p.name.startswith(".collection")]  # no temporary file left
    raw = json.loads(file.read_text())
    assert raw["format"] == "hsgds-collection" and raw["format_version"] == 1
    assert [s["path"] for s in raw["scenes"]] == ["s0.zarr", "s1.zarr", "s2.zarr"]  # relative to the folder

    for c in (hsgds.open_collection(root), open_collection(file)):
        assert isinstance(c, hsgds.Collection)
        assert len(c) == 3 and c.names == ["scene0", "scene1", "scene2"] and "scene1" in c
        assert c.paths == [p.resolve() for p in stores]
        for i, p in enumerate(stores):
            ref = json.loads((p / "zarr.json").read_text())["attributes"]["hsgds"]  # independent of Scene
            e = c.entries[i]
            assert list(e.shape) == ref["shape"] and e.dtype == ref["dtype"] and e.bands == ref["shape"][2]
            assert e.source_sha256 == ref["source"]["sha256"] and e.labels_sha256 == ref["labels_source"]["sha256"]
            assert list(e.class_names) == ref["class_names"] and e.num_classes == ref["num_classes"]
            assert e.num_samples == ref["num_samples"]
            # each split's samples per tile, against the store's arrays read with zarr-python
            z = zarr.open_group(p, mode="r")
            tile = z["samples/tile"][:].astype(np.int64)
            split = z[f"samples/split-{ref['split_generation']}" if ref.get("split_generation") else "samples/split"][:]
            nt = -(-ref["shape"][0] // ref["tile"]) * -(-ref["shape"][1] // ref["tile"])
            assert set(e.tile_samples) == {"none", "train", "val", "test"}
            for name, code in (("none", 0), ("train", 1), ("val", 2), ("test", 3)):
                assert list(e.tile_samples[name]) == np.bincount(tile[split == code], minlength=nt).tolist()
        assert c.bands == [5, 8, 5] and c.class_names == [("a", "b", "c")] * 3
        s1 = c.scene("scene1")
        assert s1 is c[1] is c.scene(1) is c.scene(-2)  # opened once, then kept
        assert s1.path == stores[1].resolve()
        np.testing.assert_array_equal(s1.read(0, 31, 0, 12), np.load(root / "c1.npy"))
        assert [s.shape for s in c] == [(20, 17, 5), (31, 12, 8), (9, 25, 5)]


def test_thousand_scenes_open_without_touching_a_store(three_stores, tmp_path):
    """collection.json alone answers every metadata question: the 1,000 stores do not exist yet, and only
    the scene that is asked for is looked at."""
    root, stores = three_stores
    template = SceneEntry.of_scene("x", open_scene(stores[0])).to_json(root)
    scenes = [dict(template, name=f"s{i:04d}", path=f"stores/s{i:04d}.zarr") for i in range(1000)]
    (tmp_path / COLLECTION_FILE).write_text(json.dumps({"format": "hsgds-collection", "format_version": 1,
                                                        "scenes": scenes}))
    c = open_collection(tmp_path)
    assert len(c) == 1000 and c.names[999] == "s0999" and c.paths[7] == tmp_path.resolve() / "stores/s0007.zarr"
    assert c.shapes == [(20, 17, 5)] * 1000 and c.wavelengths == [None] * 1000
    with pytest.raises(StoreError, match=r"scene 's0007': store .*s0007.zarr is missing; run `hsgds convert-many`"):
        c.scene(7)
    (tmp_path / "stores").mkdir()
    shutil.copytree(stores[0], tmp_path / "stores/s0007.zarr")
    assert c.scene(7).shape == (20, 17, 5)  # appears once the store exists: nothing was cached or pre-checked
    with pytest.raises(StoreError, match="s0008"):
        c.scene("s0008")


def test_a_replaced_store_is_refused(three_stores, tmp_path):
    root, stores = three_stores
    entry = SceneEntry.of_scene("a", open_scene(stores[0]))
    shutil.copytree(stores[1], tmp_path / "a.zarr")  # another scene where "a" was
    write_collection(tmp_path, [SceneEntry(**{**entry.__dict__, "path": tmp_path / "a.zarr"})])
    with pytest.raises(StoreError, match="scene 'a': the store's shape differs from collection.json"):
        open_collection(tmp_path).scene(0)


def _doc(**scene):
    base = {"name": "a", "path": "a.zarr", "shape": [4, 4, 3], "dtype": "int16", "num_classes": 0,
            "source_sha256": "00"}
    return {"format": "hsgds-collection", "format_version": 1, "scenes": [{**base, **scene}]}


@pytest.mark.parametrize("doc, message", [
    ("{not json", "cannot read it"),
    ([], "is not an hsgds collection"),
    ({"format": "hsgds-collection", "format_version": 3, "scenes": []},
     r"collection.json was written by a newer hsgds \(collection format version 3; this hsgds reads versions 1 to 2\): "
     r"upgrade hsgds, or write it again with this version's `hsgds convert-many`$"),
    ({"format": "hsgds-collection", "format_version": 0, "scenes": []},
     r"has collection format version 0; this hsgds reads versions 1 to 2: write it again with `hsgds convert-many`$"),
    ({"format": "hsgds-collection", "format_version": True, "scenes": []}, "has collection format version True"),
    ({"format": "hsgds-collection", "format_version": "2", "scenes": []}, "has collection format version 2;"),
    ({"format": "hsgds-collection", "format_version": 1, "scenes": {}}, '"scenes" must be a list'),
    (_doc(shape=[4, 4]), r"scene 0 \('a'\): shape must be \[H, W, B\]"),
    (_doc(dtype="float99"), "dtype 'float99' is not a numpy type name"),
    (_doc(wavelengths=[400.0]), "wavelengths must be null or a list of 3 numbers"),
    (_doc(wavelengths=[None, None, None]), r"wavelengths must be null or a list of 3 numbers \(nm; null for a band "
                                           r"without a centre, not for all\)"),
    (_doc(wavelengths=[None, "500", 600.0]), "wavelengths must be null or a list of 3 numbers"),
    (_doc(wavelengths=[None, 500.0, 600.0], format_version=3),
     "wavelengths has a band without a centre, but a format v3 store has a centre for every band"),
    (_doc(bands=4), "bands = 4 disagrees with shape"),
    (_doc(num_classes=-1), "num_classes must be a non-negative integer"),
    ({**_doc(), "scenes": [_doc()["scenes"][0]] * 2}, "scenes 0 and 1 are both named 'a'"),
    ({**_doc(), "scenes": [{"name": "b"}]}, r"scene 0 \('b'\): has no 'path'"),
    (_doc(tile_samples={"train": [1]}, num_samples=1), "lists tile_samples without its tile size"),
    (_doc(tile=2, halo=0, tile_samples={"train": [1, 0, 0]}, num_samples=1),
     "tile_samples must be null or an object of split name -> 4 counts"),
    (_doc(tile=2, halo=0, tile_samples={"taining": [1, 0, 0, 0]}, num_samples=1), "tile_samples must be null"),
    (_doc(tile=2, halo=0, tile_samples={"train": [1, -1, 0, 0]}, num_samples=0), "tile_samples must be null"),
    (_doc(tile=2, halo=0, tile_samples={"train": [1, 0, 0, 0], "test": [0, 0, 2, 0]}, num_samples=1),
     "tile_samples count 3 samples, num_samples says 1"),
])
def test_invalid_collection_json_is_one_line_error(tmp_path, doc, message):
    (tmp_path / COLLECTION_FILE).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(StoreError, match=message) as info:
        open_collection(tmp_path / COLLECTION_FILE)
    assert "\n" not in str(info.value)


def test_an_entrys_band_without_a_centre_is_none(tmp_path):
    """collection.json lists a band without a centre (PRISMA's unused bands) as null, as the store does: read
    as None in its place, the other centres as listed; in a version 2 file, and in a version 1 file as hsgds
    wrote them before version 2 existed."""
    for version in (2, 1):
        doc = {**_doc(wavelengths=[None, 500, 600.5], format_version=4), "format_version": version}
        (tmp_path / COLLECTION_FILE).write_text(json.dumps(doc))
        assert open_collection(tmp_path).wavelengths == [(None, 500.0, 600.5)]


def test_collection_json_records_the_oldest_version_that_describes_it(three_stores, tmp_path):
    """collection.json is version 2 exactly when an entry's wavelengths hold a null (a band without a centre),
    which a version 1 reader would call damaged; otherwise version 1, which every hsgds reads (read back as
    JSON, independently of the reader). Both open, entries as written."""
    root, stores = three_stores
    entries = [SceneEntry.of_scene(f"scene{i}", open_scene(p)) for i, p in enumerate(stores)]
    centred = [replace(e, wavelengths=tuple(400.0 + 10 * b for b in range(e.bands))) for e in entries]
    unused = replace(centred[1], wavelengths=(None, *centred[1].wavelengths[1:]), format_version=4)  # a v4 store's
    for listed, version in ((entries, 1), (centred, 1), ([centred[0], unused, centred[2]], 2)):
        file = write_collection(tmp_path, listed)
        assert json.loads(file.read_text())["format_version"] == version
        assert open_collection(file).wavelengths == [e.wavelengths for e in listed]


def test_missing_collection(tmp_path):
    with pytest.raises(StoreError, match="has no collection.json; write one with `hsgds convert-many`"):
        open_collection(tmp_path)
    with pytest.raises(StoreError, match="does not exist"):
        open_collection(tmp_path / "nowhere")


def test_verify_checks_every_scene_and_names_the_damaged_ones(three_stores, tmp_path, run_cli):
    """``hsgds verify`` on a collection: every store re-read and checked against its entry; a flipped
    byte, a missing store and a replaced one are each named, the intact scene is verified, exit 2."""
    root, stores = three_stores
    for p in stores:
        shutil.copytree(p, tmp_path / p.name)
    copies = [tmp_path / p.name for p in stores]
    _write(tmp_path, copies)
    code, out, err = run_cli("verify", tmp_path)
    assert code == 0, err
    total = sum(open_scene(p).grid.num_tiles for p in copies)
    assert out.strip() == f"ok: 3 scenes, {total} tiles, " \
        f"{sum(open_scene(p).grid.num_tiles * open_scene(p).grid.tile_nbytes for p in copies)} bytes verified"

    tile = open_scene(copies[0]).tile_paths[0]
    data = bytearray(tile.read_bytes())
    data[len(data) // 2] ^= 0x01
    tile.write_bytes(bytes(data))
    shutil.rmtree(copies[1])
    shutil.rmtree(copies[2])
    shutil.copytree(stores[0], copies[2])  # scene2's store replaced by another scene
    code, out, err = run_cli("verify", tmp_path / COLLECTION_FILE)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("hsgds: bad scene scene0: tile 0 ") and "crc32c" in lines[0]
    assert lines[1].startswith("hsgds: bad scene scene1: ") and "is missing" in lines[1]
    assert lines[2].startswith("hsgds: bad scene scene2: ") and "differs from collection.json" in lines[2]
    assert lines[3] == ("hsgds: error: 3 of 3 scenes are damaged (scene0, scene1, scene2); run the `hsgds "
                        "convert-many` that made the collection again: it converts only what is missing, "
                        "changed or damaged")


def test_verify_names_a_scene_re_split_after_the_listing(three_stores, tmp_path, run_cli):
    """A store re-split on its own after collection.json was written: a loader over labelled pixels would
    stop on it, so verify names it too."""
    from hsgds.preprocess.resplit import resplit

    root, stores = three_stores
    copies = [tmp_path / p.name for p in stores]
    for p, c in zip(stores, copies):
        shutil.copytree(p, c)
    _write(tmp_path, copies)
    resplit(copies[1], "random", train=0.3, seed=5)
    code, out, err = run_cli("verify", tmp_path)
    assert code == 2 and out == "", err
    assert "bad scene scene1: " in err and "labelled samples differ from collection.json" in err
    assert "scene0" not in err.splitlines()[0] and "1 of 3 scenes are damaged (scene1)" in err


def _train_rows(stores) -> set:
    """(scene, y, x) of every train pixel, read from each store on its own."""
    rows = set()
    for i, p in enumerate(stores):
        y, x, _ = open_scene(p).samples("train")
        rows |= {(i, int(a), int(b)) for a, b in zip(y, x)}
    return rows


def _loader_rows(folder) -> set:
    with hsgds.PatchLoader(folder, patch_size=5, batch_size=64, split="train", return_coords=True,
                           device="cpu") as loader:
        coords = [c for _, _, c in loader]
    rows = [tuple(r) for r in np.concatenate(coords).tolist()]
    assert len(rows) == len(set(rows))
    return set(rows)


def test_resplit_a_collection_rewrites_its_sample_counts(three_stores, tmp_path, run_cli):
    """``hsgds resplit`` on a collection: every scene re-split, collection.json's per-tile counts written
    anew, so a loader started from collection.json alone serves exactly the stores' new train pixels; a
    scene that cannot be re-split is named, left as it was and the others done (exit 1)."""
    root, stores = three_stores
    sources = [stores[0], stores[2], stores[0]]  # scenes of one band count, so that one loader reads them
    copies = [tmp_path / f"{name}.zarr" for name in "abc"]
    for p, c in zip(sources, copies):
        shutil.copytree(p, c)
    _write(tmp_path, copies)
    before = _train_rows(copies)
    assert _loader_rows(tmp_path) == before

    code, out, err = run_cli("resplit", tmp_path, "--split", "blocks", "--train", "0.4", "--seed", "3")
    assert code == 0, err
    assert out.splitlines()[-2] == f"re-split 3 of 3 scenes (0 unlabelled, 0 failed); wrote {tmp_path / COLLECTION_FILE}"
    assert out.splitlines()[-1].startswith("statistics: now those of the new train pixels")
    after = _train_rows(copies)
    assert after != before and all(open_scene(c).meta.split["method"] == "blocks" for c in copies)
    listed = open_collection(tmp_path).entries
    assert [e.tile_samples for e in listed] == [SceneEntry.of_scene("x", open_scene(c)).tile_samples for c in copies]
    assert _loader_rows(tmp_path) == after

    shutil.rmtree(copies[1])
    shutil.copytree(stores[1], copies[1])  # scene1's store replaced by another scene: not touched
    code, out, err = run_cli("resplit", tmp_path, "--split", "random", "--train", "0.2")
    assert code == 1
    assert "hsgds: failed: scene1: " in err and "differs from collection.json" in err
    assert err.strip().splitlines()[-1].startswith("hsgds: error: 1 of 3 labelled scenes could not be re-split (scene1)")
    assert [open_scene(c).meta.split_generation for c in copies] == [2, open_scene(stores[1]).meta.split_generation, 2]
    assert [open_scene(c).meta.split["method"] for c in copies[::2]] == ["random", "random"]
    assert _train_rows(copies[1:2]) == _train_rows(stores[1:2])  # the replaced store untouched
    listed = open_collection(tmp_path).entries
    for i in (0, 2):
        assert listed[i].tile_samples == SceneEntry.of_scene("x", open_scene(copies[i])).tile_samples


def test_resplit_a_collection_with_a_damaged_scene_keeps_collection_json_in_step(three_stores, tmp_path, run_cli):
    """The second scene's samples/zarr.json is damaged (the group its new split codes go into: opening the
    store does not read it, the re-split's write does). It is named and left as it was, the third scene is
    still re-split (exit 1), and collection.json lists the new splits of the first and third: a loader,
    which checks the listing against the stores, serves exactly their new train pixels."""
    root, stores = three_stores
    copies = [tmp_path / f"{name}.zarr" for name in "abc"]
    for p, c in zip([stores[0], stores[2], stores[0]], copies):
        shutil.copytree(p, c)
    _write(tmp_path, copies)
    (copies[1] / "samples" / "zarr.json").write_text('{"zarr_format": 3, "node_type": ')
    before = [open_scene(c).meta.split_generation for c in copies]

    code, out, err = run_cli("resplit", tmp_path, "--split", "blocks", "--train", "0.4", "--seed", "3")
    assert code == 1 and "Traceback" not in err, err
    assert "hsgds: failed: scene1: " in err and "convert the source again" in err
    assert err.strip().splitlines()[-1].startswith("hsgds: error: 1 of 3 labelled scenes could not be re-split (scene1)")
    assert "re-split 2 of 3 scenes (0 unlabelled, 1 failed)" in out
    assert [open_scene(c).meta.split_generation for c in copies] == [before[0] + 1, before[1], before[2] + 1]
    listed = open_collection(tmp_path)
    assert all(listed.listing_problem(i, open_scene(c)) is None for i, c in enumerate(copies))
    assert _loader_rows(tmp_path) == _train_rows(copies)


def test_resplit_a_collection_interrupted_after_a_scene_still_writes_collection_json(three_stores, tmp_path,
                                                                                       run_cli, monkeypatch):
    """Ctrl-C after the first scene was re-split (injected where the command reports that scene: a real
    SIGINT cannot be timed between two scenes of a few milliseconds): that scene keeps its new split, so
    collection.json must list it even though the command stops there."""
    import hsgds.info

    root, stores = three_stores
    copies = [tmp_path / f"{name}.zarr" for name in "ab"]
    for p, c in zip([stores[0], stores[2]], copies):
        shutil.copytree(p, c)
    _write(tmp_path, copies)
    before = [open_scene(c).meta.split_generation for c in copies]
    real = hsgds.info.split_summary

    def interrupted(scene):
        real(scene)
        raise KeyboardInterrupt

    monkeypatch.setattr(hsgds.info, "split_summary", interrupted)
    code, _, err = run_cli("resplit", tmp_path, "--split", "blocks", "--train", "0.4", "--seed", "3")
    # 130, the shell's code for Ctrl-C: 1 would say that some scenes failed
    assert code == 130 and err.strip().splitlines()[-1] == ("hsgds: interrupted; run the same command again to "
                                                            "finish (each store keeps its old split or the new one)")
    assert [open_scene(c).meta.split_generation for c in copies] == [before[0] + 1, before[1]]
    listed = open_collection(tmp_path)
    assert all(listed.listing_problem(i, open_scene(c)) is None for i, c in enumerate(copies))
    assert _loader_rows(tmp_path) == _train_rows(copies)


def test_ctrl_c_in_any_command_exits_130_with_one_line(three_stores, run_cli, monkeypatch):
    """Ctrl-C in a command whose rerun resumes nothing: exit 130 and a plain line, not click's "Aborted!"
    and exit 1 (injected: a real SIGINT is sent to convert-many in tests/preprocess/test_convert_many.py)."""
    import hsgds.info

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hsgds.info, "describe", interrupted)
    code, out, err = run_cli("info", three_stores[1][0])
    assert (code, out, err) == (130, "", "hsgds: interrupted\n")


def test_stores_without_collection_json_say_to_finish_the_convert_many(three_stores, tmp_path, run_cli):
    """A first convert-many stopped before it wrote collection.json leaves stores but no listing: verify, info
    and a loader say so and how to finish, not that the folder has no zarr.json."""
    root, stores = three_stores
    for p in stores:
        shutil.copytree(p, tmp_path / p.name)
    want = (f"{tmp_path} holds 3 stores (s0.zarr, s1.zarr, s2.zarr) but no collection.json (a `hsgds convert-many` "
            f"into it did not finish): run that command again to finish it, or give the stores themselves, e.g. "
            f"{tmp_path}/s0.zarr")
    for command in ("verify", "info"):
        code, out, err = run_cli(command, tmp_path)
        assert (code, err) == (2, f"hsgds: error: {want}\n"), err
    with pytest.raises(StoreError) as caught:
        hsgds.PatchLoader(tmp_path, patch_size=3, batch_size=8, device="cpu")
    assert str(caught.value) == want
    with hsgds.PatchLoader([tmp_path / p.name for p in stores if p.name != "s1.zarr"], patch_size=3, batch_size=8,
                           device="cpu") as loader:  # the stores themselves, as the message says (same bands)
        assert len(loader.scenes) == 2


def test_a_collection_given_where_one_store_is_needed_says_so(three_stores, run_cli):
    root, stores = three_stores
    folder = _write(root, stores).parent
    with pytest.raises(StoreError, match=r"is a collection \(collection.json\), not a store: give one of its scenes'"):
        open_scene(folder)
    code, out, err = run_cli("preview", folder, "-o", folder / "p.png")
    assert code == 2 and "is a collection" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", [None, 5, b"s.zarr", ["s.zarr"]])
def test_a_path_that_is_no_path_is_a_config_error(value):
    with pytest.raises(ConfigError, match="a store must be a path .str or os.PathLike., got"):
        hsgds.open_scene(value)
    with pytest.raises(ConfigError, match="a collection must be a path"):
        hsgds.open_collection(value)


def test_an_empty_collection_is_not_reported_as_verified(tmp_path, run_cli):
    write_collection(tmp_path, [])
    code, out, err = run_cli("verify", tmp_path)
    assert code == 2 and "lists no scenes" in err and out == "", (out, err)
    code, out, err = run_cli("info", tmp_path)
    assert code == 0 and "lists no scenes" in out and "dtype:" not in out, err


def test_collection_json_held_open_on_windows_is_one_line(three_stores, tmp_path, monkeypatch):
    """Windows cannot replace a collection.json another program holds open (PermissionError; Linux always
    can, so the replace is made to fail as Windows fails it): a one-line StoreError saying to close those
    programs; the previous file stays and no temporary is left."""
    import os

    root, stores = three_stores
    entries = [SceneEntry.of_scene(f"scene{i}", open_scene(p)) for i, p in enumerate(stores)]
    old = write_collection(tmp_path, entries[:1]).read_bytes()

    def held_open(src, dst):
        raise PermissionError(13, "Access is denied", str(dst))

    monkeypatch.setattr(os, "replace", held_open)
    with pytest.raises(StoreError) as caught:
        write_collection(tmp_path, entries)
    monkeypatch.undo()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot write {tmp_path / COLLECTION_FILE} (Access is denied)")
    assert "close programs that have the file open" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [COLLECTION_FILE]
    assert (tmp_path / COLLECTION_FILE).read_bytes() == old


@pytest.mark.parametrize("command", ["verify", "info"])
def test_a_stores_zarr_json_given_as_a_collection_says_to_give_the_store(three_stores, run_cli, command):
    """Any .json file is taken for a collection; a store's zarr.json (or one of its arrays') is not one,
    and the fix is to give the store folder, not to run convert-many."""
    root, stores = three_stores
    for given in (stores[0] / "zarr.json", stores[0] / "tiles" / "zarr.json"):
        code, out, err = run_cli(command, given)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.strip() == (f"hsgds: error: {given.resolve()} is a store's Zarr metadata, not a collection: give "
                               f"the store folder {stores[0].resolve()} instead")


def test_a_collection_file_that_does_not_exist_is_named_as_missing(tmp_path, run_cli):
    """A loader or a command given a collection.json path that does not exist (a typo, the wrong folder) said
    'is not a store directory; create one with `hsgds convert`': the path names a listing, not a store."""
    missing = tmp_path / "campaign" / "collection.json"
    want = f"{missing} does not exist; give a folder holding collection.json, or that file"
    with pytest.raises(StoreError) as caught:
        hsgds.PatchLoader(missing, patch_size=3, batch_size=8, device="cpu")
    assert str(caught.value) == want
    code, _, err = run_cli("info", missing)
    assert (code, err) == (2, f"hsgds: error: {want}\n")


def test_a_collection_json_writer_killed_midway_leaves_nothing_after_the_next_write(three_stores, tmp_path):
    """A process killed while it wrote collection.json (convert-many, a collection's resplit) left its hidden
    temporary, as long as the listing (megabytes for an archive), in the folder for ever; the next write removes
    those of writers that are gone, and the listing it writes is whole."""
    import signal
    import subprocess
    import sys

    _, stores = three_stores
    entries = [SceneEntry.of_scene(f"scene{i}", open_scene(p)) for i, p in enumerate(stores)]
    script = ("import json, os, signal, sys\n"
              "from hsgds.collection import open_collection, write_collection\n"
              "entries = open_collection(sys.argv[1]).entries\n"
              "def dump(doc, f, **kw):\n"
              "    f.write('{\"format\": ')\n"
              "    f.flush()\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "json.dump = dump\n"
              "write_collection(sys.argv[2], entries)\n")
    write_collection(tmp_path, entries, name="given.json")
    (tmp_path / "out").mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "given.json"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert len(list((tmp_path / "out").iterdir())) == 1  # its temporary, nothing at collection.json
    write_collection(tmp_path / "out", entries)
    assert [p.name for p in (tmp_path / "out").iterdir()] == [COLLECTION_FILE]
    assert open_collection(tmp_path / "out").names == ["scene0", "scene1", "scene2"]
