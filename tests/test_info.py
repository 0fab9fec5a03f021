"""``hsgds info``: the leakage line (test patches overlapping train patches) and the split line."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from scipy.ndimage import distance_transform_cdt

import hsgds
from hsgds import format as fmt
from hsgds.info import leakage
from hsgds.preprocess.convert import ConvertOptions, convert


def leaky_reference(scene, p, split="test"):
    """Test (``split``) pixels whose p x p patch shares a scene pixel with some train pixel's p x p patch, by
    brute force on the footprints for a sample and by scipy's chessboard distance transform for all of them."""
    h, w = scene.shape[:2]
    codes = np.zeros((h, w), np.uint8)
    for name, code in fmt.SPLIT_CODES.items():
        y, x, _ = scene.samples(name)
        codes[y, x] = code
    train = codes == fmt.SPLIT_TRAIN
    test = codes == fmt.SPLIT_CODES[split]
    dist = distance_transform_cdt(~train, metric="chessboard")
    leaky = test & (dist <= p - 1)
    # brute force on a few test pixels: does any scene pixel of its footprint lie in a train footprint?
    r = (p - 1) // 2
    cover = np.zeros((h + 2 * r, w + 2 * r), bool)  # union of train footprints (scene padded by r)
    for y, x in zip(*np.nonzero(train)):
        cover[y:y + p, x:x + p] = True
    ty, tx = np.nonzero(test)
    for i in np.linspace(0, len(ty) - 1, 60).astype(int):
        y, x = ty[i], tx[i]
        assert bool(cover[y:y + p, x:x + p].any()) == bool(leaky[y, x])
    return int(leaky.sum()), int(test.sum())


@pytest.mark.parametrize("p", [15, 7, 3, 1])
def test_leakage_random_split_indian_pines(indian_pines_store, p):
    scene = hsgds.open_scene(indian_pines_store)
    leak = leakage(scene, p)
    assert (leak.leaky, leak.test) == leaky_reference(scene, p)
    if p == 1:
        assert leak.leaky == 0  # a 1x1 patch is the pixel itself: no overlap in a split
    if p == 15:
        assert leak.leaky == leak.test  # a 10% random split: every test patch overlaps a train patch


def test_info_leakage_lines(indian_pines_store, tmp_path, run_cli, npy_scene):
    code, out, err = run_cli("info", indian_pines_store)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("leakage:"))
    scene = hsgds.open_scene(indian_pines_store)
    n_leaky, n_test = leaky_reference(scene, 15)
    assert f"{n_leaky} of {n_test} test pixels (100.0%) have a 15x15 patch" in line
    assert "use `--split blocks`" in line
    code, out, err = run_cli("info", indian_pines_store, "--patch-size", "5")
    n_leaky, n_test = leaky_reference(scene, 5)
    assert f"leakage:    {n_leaky} of {n_test} test pixels ({100 * n_leaky / n_test:.1f}%) have a 5x5 patch" in out
    # a block split: footprints disjoint, and the split line reports the guard loss
    cp, lp, _, _ = npy_scene(h=90, w=80, b=3, seed=7)
    store = tmp_path / "b.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(cp, store, ConvertOptions(labels=lp, split="blocks", train=0.3, max_patch=7))
    code, out, err = run_cli("info", store)
    assert code == 0, err
    assert re.search(r"leakage:    0 of \d+ test pixels \(0\.0%\) have a 7x7 patch .* disjoint", out)
    meta = hsgds.open_scene(store).meta
    assert f"keeping train 6 px from the other splits dropped {meta.split['guard_lost']} labelled pixels" in out
    assert f"block_size={meta.split['block_size']} (adaptive)" in out
    # a larger patch than the split was made for leaks again
    code, out, err = run_cli("info", store, "--patch-size", "15")
    assert re.search(r"leakage:    [1-9]\d* of \d+ test pixels .* 15x15 patch", out)
    # ... and the pointer says how to guard that patch size, not to use the split it already has
    assert "keeps patches up to 7x7 apart: convert again with `--split blocks --max-patch 15`" in out
    assert "use `--split blocks`" not in out


def test_info_leakage_counts_val_pixels_too(indian_pines_store, tmp_path, run_cli):
    """The leakage line counted only test patches overlapping train patches; a random split's val patches
    overlap them too (model selection on them is optimistic). With a val split the line counts both, each
    against scipy's distance transform (and brute force on the footprints); a block split's guard keeps val
    apart as well, and a store without val reads as before."""
    import shutil

    store = tmp_path / "ip.zarr"
    shutil.copytree(indian_pines_store, store)
    assert run_cli("resplit", store, "--split", "random", "--train", "0.1", "--val", "0.1")[0] == 0
    scene = hsgds.open_scene(store)
    for p in (15, 3, 1):
        leak = leakage(scene, p)
        assert (leak.leaky, leak.test) == leaky_reference(scene, p)
        assert (leak.val_leaky, leak.val) == leaky_reference(scene, p, "val")
    n_val_leaky, n_val = leaky_reference(scene, 3, "val")
    assert 0 < n_val_leaky < n_val  # 3x3 patches: some val patches overlap train patches, some do not
    n_leaky, n_test = leaky_reference(scene, 3)
    code, out, err = run_cli("info", store, "--patch-size", "3")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("leakage:"))
    assert line.startswith(f"leakage:    {n_leaky} of {n_test} test pixels ({100 * n_leaky / n_test:.1f}%) and "
                           f"{n_val_leaky} of {n_val} val pixels ({100 * n_val_leaky / n_val:.1f}%) have a 3x3 patch "
                           "sharing pixels with a train patch; their scores are optimistic"), line
    # a block split with val: the guard keeps val and test 7x7 patches clear of train patches
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run_cli("resplit", store, "--split", "blocks", "--train", "0.3", "--val", "0.1")[0] == 0
    scene = hsgds.open_scene(store)
    assert leaky_reference(scene, 15, "val") == (0, leakage(scene).val) and leakage(scene).val > 0
    code, out, err = run_cli("info", store)
    line = next(ln for ln in out.splitlines() if ln.startswith("leakage:"))
    assert re.fullmatch(r"leakage:    0 of \d+ test pixels \(0\.0%\) and 0 of \d+ val pixels \(0\.0%\) have a 15x15 "
                        r"patch sharing pixels with a train patch: train footprints are disjoint from test and val "
                        r"footprints", line), line


def test_info_leakage_of_a_split_with_val_but_no_test_pixels(npy_scene, tmp_path, run_cli):
    """A mask split with train and val masks and an empty test mask still has val patches to compare with
    train patches: the line said "no train/test split to compare"; it counts the val pixels (against scipy)."""
    cp, lp, _, labels = npy_scene(b=3)
    train = np.zeros(labels.shape, np.uint8)
    train[:, ::2] = 1
    np.save(tmp_path / "tm.npy", train)
    np.save(tmp_path / "vm.npy", 1 - train)
    np.save(tmp_path / "te.npy", np.zeros_like(train))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (every class lacks test pixels: said, not refused)
        convert(cp, tmp_path / "m.zarr", ConvertOptions(labels=lp, max_patch=3, split="masks",
                                                         train_mask=tmp_path / "tm.npy", val_mask=tmp_path / "vm.npy",
                                                         test_mask=tmp_path / "te.npy"))
    scene = hsgds.open_scene(tmp_path / "m.zarr")
    n_val_leaky, n_val = leaky_reference(scene, 3, "val")
    assert n_val > 0 and len(scene.samples("test")[0]) == 0
    code, out, err = run_cli("info", tmp_path / "m.zarr", "--patch-size", "3")
    line = next(ln for ln in out.splitlines() if ln.startswith("leakage:"))
    assert code == 0 and line.startswith(f"leakage:    {n_val_leaky} of {n_val} val pixels "
                                         f"({100 * n_val_leaky / n_val:.1f}%) have a 3x3 patch sharing pixels with a "
                                         "train patch"), line


@pytest.mark.parametrize("bad", ["4", "0", "-3"])
def test_info_bad_patch_size(indian_pines_store, run_cli, bad):
    code, out, err = run_cli("info", indian_pines_store, "--patch-size", bad)
    assert code == 2 and out == ""
    assert err == f"hsgds: error: --patch-size must be a positive odd number (patches are pixel-centred), got {bad}\n"


def test_info_patch_size_of_what_has_no_leakage_line_is_refused(npy_scene, tmp_path, run_cli):
    """--patch-size sets a store's leakage line. A collection's summary (collection.json alone), a source's and a
    model file's have none: the option was dropped without a word, so `hsgds info campaign/ --patch-size 15`
    looked like an answer without the leakage asked for. Refused in one line, naming what to run instead."""
    from hsgds.collection import SceneEntry, write_collection

    cp, lp, _, _ = npy_scene(b=3)
    store = convert(cp, tmp_path / "a.zarr", ConvertOptions(labels=lp, max_patch=5))
    write_collection(tmp_path, [SceneEntry.of_scene("a", hsgds.open_scene(store))])
    (tmp_path / "model.pt2").write_bytes(b"PK")  # a model file by its name: refused before it is loaded
    for what in (tmp_path, tmp_path / "collection.json", cp, lp, tmp_path / "model.pt2"):
        code, out, err = run_cli("info", what, "--patch-size", "3")
        assert (code, out) == (2, ""), (what, out, err)
        assert err == ("hsgds: error: --patch-size sets the leakage line of a store (a .zarr folder); a collection, "
                       "a source or a model file has none: run `hsgds info STORE --patch-size 3` on a scene's "
                       "store\n"), err
    code, out, err = run_cli("info", store, "--patch-size", "3")
    assert code == 0 and "have a 3x3 patch" in out, err


def test_info_without_labels(npy_scene, tmp_path, run_cli):
    cp, _, _, _ = npy_scene(b=3)
    store = tmp_path / "u.zarr"
    convert(cp, store, ConvertOptions())
    code, out, err = run_cli("info", store)
    assert code == 0, err
    assert "leakage:    no train/test split to compare (0 train, 0 test pixels)" in out


def test_info_split_line_of_a_mask_split_names_the_masks_not_their_sha256(npy_scene, tmp_path, run_cli):
    """A mask split records each mask's sha256 (for convert-many reruns, read here with zarr-python): the split
    line printed every key, so two or three 64-digit hashes followed the mask names. The line names the masks;
    the hashes stay in the store."""
    import zarr

    cp, lp, _, labels = npy_scene(b=3)
    left = np.zeros(labels.shape, np.uint8)
    left[:, ::2] = 1  # every other column: each class in both masks
    np.save(tmp_path / "tm.npy", left)
    np.save(tmp_path / "te.npy", 1 - left)
    store = tmp_path / "m.zarr"
    convert(cp, store, ConvertOptions(labels=lp, split="masks", train_mask=tmp_path / "tm.npy",
                                      test_mask=tmp_path / "te.npy"))
    split = zarr.open_group(store, mode="r").attrs["hsgds"]["split"]
    assert {"train_mask_sha256", "test_mask_sha256"} <= set(split)
    code, out, err = run_cli("info", store)
    assert code == 0, err
    line = next(t for t in out.splitlines() if t.startswith("split:"))
    assert line == ("split:      method=masks, train_mask=tm.npy, test_mask=te.npy; normalization stats "
                    "from train pixels"), line
    assert split["train_mask_sha256"] not in out and split["test_mask_sha256"] not in out


def test_a_mask_split_records_and_shows_no_seed(npy_scene, tmp_path, run_cli):
    """A mask split draws nothing: it recorded seed=0 and `hsgds info` showed `method=masks, seed=0, ...`. The
    store (read with zarr-python) records no seed, and a store written before, whose record holds seed=0, is
    shown without it and kept by a convert-many rerun (its mask split is up to date, seed or not)."""
    import json

    import zarr

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cp, lp, _, labels = npy_scene(b=3)
    left = np.zeros(labels.shape, np.uint8)
    left[:, ::2] = 1
    np.save(tmp_path / "tm.npy", left)
    np.save(tmp_path / "te.npy", 1 - left)
    opts = ConvertOptions(max_patch=3, split="masks", train_mask=tmp_path / "tm.npy", test_mask=tmp_path / "te.npy")
    out = tmp_path / "out"
    out.mkdir()
    row = ManifestRow(name="m", source=cp, labels=lp)
    assert convert_scene(row, out, opts).status == "converted"
    attrs = zarr.open_group(out / "m.zarr", mode="r").attrs["hsgds"]
    assert "seed" not in attrs["split"] and "seed" not in attrs["converted_split"]
    assert attrs["split"]["method"] == "masks"
    assert convert_scene(row, out, opts).status == "up to date"
    # a store written before: seed=0 in its records
    doc = json.loads((out / "m.zarr" / "zarr.json").read_text())
    for record in ("split", "converted_split"):
        doc["attributes"]["hsgds"][record] = {"method": "masks", "seed": 0, **doc["attributes"]["hsgds"][record]}
    (out / "m.zarr" / "zarr.json").write_text(json.dumps(doc))
    code, text, err = run_cli("info", out / "m.zarr")
    assert code == 0, err
    line = next(t for t in text.splitlines() if t.startswith("split:"))
    assert line.startswith("split:      method=masks, train_mask=tm.npy, test_mask=te.npy;") and "seed" not in line
    assert convert_scene(row, out, opts).status == "up to date"


def test_info_on_a_collection_reads_collection_json_alone(npy_scene, tmp_path, run_cli):
    """`hsgds info FOLDER` summarizes a collection from collection.json alone (its stores are removed
    first): scenes, bands, and each scene's labelled pixels per split, equal to the stores' own sample
    arrays read with zarr-python."""
    import shutil

    import zarr

    from hsgds.collection import SceneEntry, write_collection

    folder = tmp_path / "coll"
    folder.mkdir()
    entries, want = [], {}
    for seed, (h, w, b, labelled) in enumerate([(37, 29, 6, True), (20, 31, 6, True), (25, 25, 4, False)]):
        cp, lp, _, _ = npy_scene(h=h, w=w, b=b, seed=seed)
        store = folder / f"s{seed}.zarr"
        convert(cp, store, ConvertOptions(labels=lp, train=0.3, val=0.2) if labelled else ConvertOptions())
        entries.append(SceneEntry.of_scene(f"s{seed}", hsgds.open_scene(store)))
        z = zarr.open_group(store, mode="r")
        split = z["samples/split"][:] if labelled else np.zeros(0, np.uint8)
        want[f"s{seed}"] = [int(np.count_nonzero(split == c)) for c in (1, 2, 3, 0)] + [len(split)]
    write_collection(folder, entries)
    for s in folder.glob("*.zarr"):
        shutil.rmtree(s)
    code, out, err = run_cli("info", folder)
    assert code == 0, err
    assert f"collection: {(folder / 'collection.json').resolve()} (3 scenes, {37 * 29 + 20 * 31 + 25 * 25:,} pixels" in out
    assert "bands:      6 (2 scenes), 4 (1 scene)" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"(s\d|all) ", line)}
    for name, counts in want.items():  # train, val, test, none, labelled
        assert [int(v) for v in rows[name][-5:]] == counts
    assert [int(v) for v in rows["all"][-5:]] == [sum(c[i] for c in want.values()) for i in range(5)]
    assert want["s0"][0] > 0 and want["s0"][1] > 0
    # a listing written before the per-tile counts: the labelled totals only
    import json

    doc = json.loads((folder / "collection.json").read_text())
    for scene in doc["scenes"]:
        scene.pop("tile_samples")
    (folder / "collection.json").write_text(json.dumps(doc))
    code, out, err = run_cli("info", folder)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"(s\d|all) ", line)}
    assert "train" not in out and {n: int(r[-1]) for n, r in rows.items()} == {
        **{n: c[4] for n, c in want.items()}, "all": sum(c[4] for c in want.values())}


def test_info_on_a_collection_names_scenes_re_split_since_the_listing(npy_scene, tmp_path, run_cli):
    """A store of a collection re-split directly (`hsgds resplit coll/s0.zarr`) left collection.json's per-split
    counts as they were, and `hsgds info coll` showed them without a word. It now names that scene (and only
    it: the scenes a loader's full check, Collection.listing_problem, finds changed), says how to fix it, and
    the fix (a re-split through the collection) clears it, the counts then equal to zarr-python's of the
    stores; a missing store and a listing written before fingerprints are said as such."""
    import json
    import shutil

    import zarr

    from hsgds.collection import SceneEntry, open_collection, write_collection

    folder = tmp_path / "coll"
    folder.mkdir()
    entries = []
    for seed, labelled in enumerate([True, True, False]):
        cp, lp, _, _ = npy_scene(h=30, w=26, b=3, seed=seed)
        store = folder / f"s{seed}.zarr"
        convert(cp, store, ConvertOptions(labels=lp, train=0.3) if labelled else ConvertOptions())
        entries.append(SceneEntry.of_scene(f"s{seed}", hsgds.open_scene(store)))
    write_collection(folder, entries)

    def info() -> tuple[str, dict[str, list[int]]]:
        code, out, err = run_cli("info", folder)
        assert code == 0, err
        return out, {line.split()[0]: [int(v) for v in line.split()[-5:-1]] for line in out.splitlines()
                     if re.match(r"s\d ", line)}

    def stored(name: str) -> list[int]:  # train, val, test, none of the store's current split, by zarr-python
        z = zarr.open_group(folder / f"{name}.zarr", mode="r")
        g = z.attrs["hsgds"].get("split_generation", 0)
        codes = z["samples/split" if g == 0 else f"samples/split-{g}"][:]
        return [int(np.count_nonzero(codes == c)) for c in (1, 2, 3, 0)]

    out, rows = info()
    assert "stale:" not in out and "unread:" not in out and "unchecked:" not in out, out
    # the listed fingerprint is docs/format.md's digest of the store's metadata, read with zarr-python
    import hashlib

    listed = {d["name"]: d["split_fingerprint"] for d in json.loads((folder / "collection.json").read_text())["scenes"]}
    for name in ("s0", "s1"):
        meta = zarr.open_group(folder / f"{name}.zarr", mode="r").attrs["hsgds"]
        text = json.dumps({"split": meta["split"], "generation": meta.get("split_generation", 0),
                           "labels": meta["labels_source"]["sha256"]}, sort_keys=True)
        assert listed[name] == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert listed["s2"] is None
    before = rows["s0"]
    code, _, err = run_cli("resplit", folder / "s0.zarr", "--split", "random", "--train", "0.6")
    assert code == 0 and f"hsgds: warning: {folder.resolve() / 'collection.json'} still lists scene 's0' with its old " \
        "split" in err, err  # said when it happens, too
    assert stored("s0") != before  # the store changed ...
    out, rows = info()
    assert rows["s0"] == before and rows["s1"] == stored("s1")  # ... the listing did not
    coll = open_collection(folder)
    changed = [e.name for i, e in enumerate(coll.entries) if e.num_samples and coll.listing_problem(i, coll.scene(i))]
    assert changed == ["s0"]
    line = next(ln for ln in out.splitlines() if ln.startswith("stale:"))
    assert line == ("stale:      1 scene (s0) was re-split or converted again after collection.json was written: the "
                    "per-split counts below are the listing's, not the stores'; run the `hsgds convert-many` that "
                    "wrote it again (each store keeps its split, the listing is rewritten), or re-split every scene "
                    f"through the collection (`hsgds resplit {folder.resolve()} --split ...`)"), line
    assert run_cli("resplit", folder, "--split", "random", "--train", "0.6")[0] == 0
    out, rows = info()
    assert "stale:" not in out and rows == {"s0": stored("s0"), "s1": stored("s1"), "s2": [0, 0, 0, 0]}, out
    # a listing written before the fingerprints: said, not guessed
    doc = json.loads((folder / "collection.json").read_text())
    for entry in doc["scenes"]:
        entry.pop("split_fingerprint")
    (folder / "collection.json").write_text(json.dumps(doc))
    out, _ = info()
    assert "stale:" not in out and "unchecked:  2 labelled scenes: collection.json (written by an older hsgds)" in out
    # a missing store: named, the summary still shown
    write_collection(folder, [SceneEntry.of_scene(n, hsgds.open_scene(folder / f"{n}.zarr")) for n in ("s0", "s1", "s2")])
    shutil.rmtree(folder / "s1.zarr")
    out, rows = info()
    assert "unread:     1 scene (s1): the store's zarr.json is missing or unreadable" in out and "stale:" not in out
    assert set(rows) == {"s0", "s1", "s2"}


def test_collection_summary_tallies_dtypes_bands_and_wavelengths(tmp_path):
    from hsgds.collection import Collection, SceneEntry
    from hsgds.info import describe_collection

    def entry(name, bands, dtype, wavelengths):
        return SceneEntry(name=name, path=tmp_path / f"{name}.zarr", shape=(4, 5, bands), dtype=dtype,
                          wavelengths=wavelengths, band_names=None, num_classes=0, class_names=None, num_samples=0,
                          source_sha256="")

    text = describe_collection(Collection(tmp_path / "collection.json", [
        entry("a", 3, "int16", (400.0, 500.0, 600.0)), entry("b", 3, "uint16", (450.0, 550.0, 900.0)),
        entry("c", 2, "int16", None)]))
    assert "(3 scenes, 60 pixels," in text
    # with what a loader over all of them needs (it refuses several dtypes, and band counts without wavelengths)
    assert ("dtype:      int16 (2 scenes), uint16 (1 scene); a loader reads one dtype: run the same convert-many "
            "command with --dtype float32\n") in text
    assert "bands:      3 (2 scenes), 2 (1 scene); a loader over every scene selects bands with wavelengths=[...] (nm)\n" in text
    assert "spectrum:   400.0-900.0 nm (1 scene without wavelengths)" in text
    # a sensor listing its bands descending (PRISMA): the span is still lowest to highest
    falling = describe_collection(Collection(tmp_path / "collection.json", [
        entry("a", 3, "int16", (400.0, 500.0, 600.0)), entry("p", 3, "uint16", (950.0, 700.0, 402.5))]))
    assert "spectrum:   400.0-950.0 nm" in falling
    assert text.endswith("classes:    none (no scene has labels)")
    one = describe_collection(Collection(tmp_path / "collection.json", [entry("a", 3, "int16", None)]))
    assert "(1 scene, 20 pixels," in one and "a loader" not in one


def test_collection_summary_lists_labelled_scenes_before_unlabelled_ones(tmp_path):
    """An archive of 24 unlabelled tiles listed before its 2 labelled scenes: the table of the first 20 scenes
    showed only unlabelled rows of zeros. Labelled scenes come first when not every scene fits, the rest in
    collection order, and the line for the others says they are unlabelled."""
    from hsgds.collection import Collection, SceneEntry
    from hsgds.info import LISTED_SCENES, describe_collection

    def entry(name, samples):
        return SceneEntry(name=name, path=tmp_path / f"{name}.zarr", shape=(4, 5, 3), dtype="int16",
                          wavelengths=None, band_names=None, num_classes=2 if samples else 0, class_names=None,
                          num_samples=samples, source_sha256="")

    entries = [entry(f"tile_{i:02d}", 0) for i in range(24)] + [entry("site_a", 7), entry("site_b", 5)]
    rows = [line.split()[0] for line in describe_collection(Collection(tmp_path / "collection.json", entries))
            .splitlines() if line.startswith(("tile_", "site_", "..."))]
    assert LISTED_SCENES == 20
    assert rows == [f"tile_{i:02d}" for i in range(18)] + ["site_a", "site_b", "..."]
    text = describe_collection(Collection(tmp_path / "collection.json", entries))
    assert "... and 6 more scenes (unlabelled)\n" in text and text.endswith(f"{12:>10}")
    # all fit: collection order, no line for more
    few = describe_collection(Collection(tmp_path / "collection.json", entries[:3] + entries[-1:]))
    assert [line.split()[0] for line in few.splitlines() if line.startswith(("tile_", "site_"))] == [
        "tile_00", "tile_01", "tile_02", "site_b"] and "more scenes" not in few


def test_info_of_a_missing_model_file_names_it(tmp_path, run_cli):
    code, _, err = run_cli("info", tmp_path / "model.pt2")
    assert code == 2 and "no model file" in err and "store" not in err, err


# -- source nodata (format v3) -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nodata_scene(nodata_store):
    store, _, _, nodata = nodata_store(70, 50, 8, seed=2)
    return store, nodata


def test_info_shows_the_nodata_record(nodata_scene, tmp_path, run_cli):
    from hsgds.collection import SceneEntry, write_collection

    store, nodata = nodata_scene
    n = int(nodata.sum())
    code, out, err = run_cli("info", store)
    assert code == 0, err
    assert (f"nodata:     value -9999 in every band: {n} pixels ({100 * n / 3500:.1f}%), filled with the train "
            "mean, never sampled; 0 labelled pixels dropped") in out
    write_collection(tmp_path, [SceneEntry.of_scene("swath", hsgds.open_scene(store))])
    code, out, err = run_cli("info", tmp_path)
    assert code == 0, err
    assert f"nodata:     {n:,} pixels without data in 1 scene" in out


def _damaged_copy(store, tmp_path, damage):
    import json
    import shutil

    import zarr

    copy = shutil.copytree(store, tmp_path / "s.zarr")
    if damage == "missing":
        shutil.rmtree(copy / fmt.NODATA)
    elif damage == "count":
        root = json.loads((copy / "zarr.json").read_text())
        root["attributes"]["hsgds"]["nodata"]["pixels"] -= 1
        (copy / "zarr.json").write_text(json.dumps(root))
    else:
        array = zarr.open_array(copy / (fmt.NODATA if damage in ("value", "flipped") else fmt.LABELS), mode="r+")
        values = array[:]
        y, x = np.argwhere(np.asarray(zarr.open_array(copy / fmt.NODATA, mode="r")[:]))[0]
        if damage == "value":
            values[y, x] = 7
        elif damage == "flipped":  # one nodata pixel lost
            values[y, x] = 0
        else:
            values[y, x] = 1
        array[:] = values
    return copy


@pytest.mark.parametrize("damage, message", [
    ("missing", r"nodata/zarr.json is missing"),
    ("value", r"array nodata must hold uint8 0 or 1, got uint8 up to 7"),
    ("flipped", r"array nodata marks (\d+) pixels, the metadata records (\d+)"),
    ("count", r"array nodata marks (\d+) pixels, the metadata records (\d+)"),
    ("labelled", r"array nodata: 1 nodata pixels are labelled and 0 are samples"),
])
def test_verify_checks_the_nodata_map(nodata_scene, tmp_path, run_cli, damage, message):
    store, _ = nodata_scene
    assert hsgds.open_scene(store).verify_arrays() == []
    copy = _damaged_copy(store, tmp_path, damage)
    problems = hsgds.open_scene(copy).verify_arrays()
    assert re.search(message, problems[0]), problems
    # a pixel labelled in the map only is also a disagreement with the sample table
    also = ["the labels and the samples disagree"] if damage == "labelled" else []
    assert len(problems) == 1 + len(also) and all(a in p for a, p in zip(also, problems[1:])), problems
    code, _, err = run_cli("verify", copy)
    assert code == 2 and "in its labels, samples, statistics or nodata map" in err and "Traceback" not in err, err
