"""The converter against independent references: numpy padding, zarr-python, google-crc32c, numpy stats."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc

import google_crc32c
import numpy as np
import pytest
import zarr

import hsgds
from hsgds import format as fmt
from hsgds.preprocess.convert import ConvertOptions, convert


def reference_tiles(cube: np.ndarray, tile: int, halo: int, padding: str) -> np.ndarray:
    """(nty, ntx, S, S, B) written with numpy alone: pad by the halo, zero beyond it, cut overlapping tiles."""
    h, w, b = cube.shape
    nty, ntx = -(-h // tile), -(-w // tile)
    mode = "constant" if padding == "zero" else padding
    padded = np.pad(cube, ((halo, halo), (halo, halo), (0, 0)), mode=mode)
    big = np.zeros((nty * tile + 2 * halo, ntx * tile + 2 * halo, b), cube.dtype)
    big[:h + 2 * halo, :w + 2 * halo] = padded
    s = tile + 2 * halo
    return np.stack([np.stack([big[ty * tile:ty * tile + s, tx * tile:tx * tile + s] for tx in range(ntx)])
                     for ty in range(nty)])


@pytest.mark.parametrize("dtype,fortran,padding,max_patch", [
    ("int16", False, "reflect", 15),
    ("uint16", True, "edge", 13),
    ("float32", False, "zero", 5),
    ("uint8", True, "reflect", 1),
    ("float64", False, "reflect", 9),
])
def test_store_matches_independent_reference(npy_scene, tmp_path, dtype, fortran, padding, max_patch):
    cp, lp, cube, labels = npy_scene(dtype=dtype, fortran=fortran, seed=3)
    out = convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=lp, padding=padding, max_patch=max_patch,
                                                          train=0.3, val=0.1, seed=5))
    scene = hsgds.open_scene(out)
    assert scene.shape == cube.shape and scene.dtype == cube.dtype
    np.testing.assert_array_equal(scene.read(0, cube.shape[0], 0, cube.shape[1]), cube)
    rng = np.random.default_rng(0)
    for _ in range(5):
        y0, x0 = rng.integers(0, cube.shape[0] - 1), rng.integers(0, cube.shape[1] - 1)
        y1, x1 = rng.integers(y0 + 1, cube.shape[0] + 1), rng.integers(x0 + 1, cube.shape[1] + 1)
        np.testing.assert_array_equal(scene.read(y0, y1, x0, x1), cube[y0:y1, x0:x1])

    # zarr-python reads the tiles; they equal numpy's padding of the source
    g = zarr.open_group(out, mode="r")
    ref = reference_tiles(cube, scene.grid.tile, (max_patch - 1) // 2, padding)
    np.testing.assert_array_equal(g["tiles"][...], ref)
    np.testing.assert_array_equal(g["labels"][...], labels)
    for tile_id, path in enumerate(scene.tile_paths):
        raw = path.read_bytes()
        assert len(raw) % fmt.ALIGNMENT == 0
        assert int.from_bytes(google_crc32c.Checksum(raw).digest(), "big") == scene.meta.checksums[tile_id]

    # every labelled pixel is one sample, in its tile, with its label and a split code
    y, x, lab = scene.samples(None)
    assert len(y) == np.count_nonzero(labels)
    np.testing.assert_array_equal(lab, labels[y, x])
    table = scene.sample_table()
    np.testing.assert_array_equal(table["tile"], (y // scene.grid.tile) * scene.grid.ntx + x // scene.grid.tile)
    assert np.all(np.diff(table["tile"]) >= 0)
    assert table["offsets"][-1] == len(y)

    # statistics: train pixels only, population std; and the whole scene
    ty, tx, _ = scene.samples("train")
    train_px = cube[ty, tx].astype(np.float64)
    st = scene.stats["train"]
    np.testing.assert_allclose(st.mean, train_px.mean(0), rtol=1e-10)
    np.testing.assert_allclose(st.std, train_px.std(0), rtol=1e-8)
    np.testing.assert_array_equal(st.min, train_px.min(0))
    np.testing.assert_array_equal(st.max, train_px.max(0))
    allpx = cube.reshape(-1, cube.shape[2]).astype(np.float64)
    np.testing.assert_allclose(scene.stats["all"].mean, allpx.mean(0), rtol=1e-10)
    np.testing.assert_allclose(scene.stats["all"].std, allpx.std(0), rtol=1e-8)


@pytest.mark.parametrize("source,target", [("uint16", "float32"), ("int16", "int32"), ("float64", "float32"),
                                           ("float32", "int16")])
def test_dtype_stores_the_samples_cast(npy_scene, tmp_path, run_cli, source, target):
    """--dtype stores the cube as another sample type (scenes of several sensors then load together): the tiles
    zarr-python reads equal numpy's cast of the padded source, the statistics are those of the cast values,
    and `hsgds info` says the store was cast."""
    cp, lp, cube, labels = npy_scene(dtype=source, seed=4)
    if target == "int16":  # integers held as floats: cast exactly
        cube = np.rint(cube / 4).astype(source)
        np.save(cp, cube)
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "s.zarr", "--max-patch", "5",
                           "--dtype", target)
    assert code == 0, err
    scene = hsgds.open_scene(tmp_path / "s.zarr")
    expected = cube.astype(target)
    assert scene.dtype == np.dtype(target) and scene.meta.source["dtype"] == source
    ref = reference_tiles(expected, scene.grid.tile, 2, "reflect")
    np.testing.assert_array_equal(zarr.open_group(tmp_path / "s.zarr", mode="r")["tiles"][...], ref)
    ty, tx, _ = scene.samples("train")
    np.testing.assert_allclose(scene.stats["train"].mean, expected[ty, tx].astype(np.float64).mean(0), rtol=1e-10)
    assert scene.verify() == []
    code, out, _ = run_cli("info", tmp_path / "s.zarr")
    assert f"scene:      37x29x6 {target} (cast from the source's {source} by --dtype)" in out


@pytest.mark.parametrize("values,target,shown", [
    ([1.0, 2.5], "int16", "2.5"),  # a fraction
    ([1.0, float(2**15)], "int16", "32768.0"),  # out of range
    ([0.0, 1e300], "float32", "1e+300"),  # would overflow to inf
    ([0, 2**24 + 1], "float32", str(2**24 + 1)),  # an integer float32 rounds
    ([0, -1], "uint16", "-1"),
])
def test_dtype_refuses_a_value_it_cannot_hold(tmp_path, run_cli, values, target, shown):
    dtype = "float64" if isinstance(values[0], float) else "int64"
    cube = np.zeros((9, 8, 3), dtype)
    cube[4, 5, 1] = values[1]
    cube[0, 0, 0] = values[0]
    np.save(tmp_path / "c.npy", cube)
    _bad(tmp_path, run_cli, tmp_path / "c.npy", "-o", tmp_path / "s.zarr", "--dtype", target,
         match=f"--dtype {target}: c.npy holds {shown} (near rows 0:9, columns 0:8), which {target} cannot hold "
               f"exactly; choose a wider --dtype")
    _bad(tmp_path, run_cli, tmp_path / "c.npy", "-o", tmp_path / "s.zarr", "--dtype", "f4",
         match="--dtype must be one of uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32, float64, "
               "got 'f4'")


def test_dtype_with_nodata_fills_after_the_cast(tmp_path, run_cli):
    """Nodata pixels of a cast store are left out and filled with the train mean, as without a cast, and read
    as the nodata value; a --dtype that cannot hold that value is refused before any work (--nodata none
    converts every pixel)."""
    from hsgds.synthetic import make_scene

    cube, labels = make_scene(30, 26, 4, classes=3, dtype="int16", seed=6)
    cube = np.abs(cube)
    cube[:, :5] = -9999
    labels[:, :5] = 0
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    args = ("convert", tmp_path / "c.npy", "--labels", tmp_path / "gt.npy", "--max-patch", "3", "--nodata", "-9999")
    code, _, err = run_cli(*args, "-o", tmp_path / "s.zarr", "--dtype", "float32")
    assert code == 0, err
    scene = hsgds.open_scene(tmp_path / "s.zarr")
    np.testing.assert_array_equal(scene.read(0, 30, 0, 26), cube.astype(np.float32))
    held = scene.read_tile(0)[1:-1, 1:-1]  # (one tile, halo 1)
    fill = scene.stats["train"].mean.astype(np.float32)
    assert (held[:30, :5] == fill).all()
    _bad(tmp_path, run_cli, *args[1:], "-o", tmp_path / "u.zarr", "--dtype", "uint16",
         match="--dtype uint16 cannot hold the nodata value -9999, which the store's scene reads give at pixels "
               "without data; choose a --dtype that holds it (float32 holds any), or pass --nodata none")


def test_scenes_of_several_dtypes_load_together_after_dtype(npy_scene, tmp_path, run_cli):
    """A loader refuses scenes of two sample types and names the fix; converted with one --dtype they load."""
    a, la, cube_a, _ = npy_scene(dtype="uint16", seed=1)
    b, lb, cube_b, _ = npy_scene(dtype="float32", seed=2)
    for src, gt, name, extra in ((a, la, "a", ()), (b, lb, "b", ()), (a, la, "a32", ("--dtype", "float32"))):
        code, _, err = run_cli("convert", src, "--labels", gt, "-o", tmp_path / f"{name}.zarr", "--max-patch", "3",
                               *extra)
        assert code == 0, err
    with pytest.raises(hsgds.ConfigError, match=r"scenes have different dtype \(a: uint16, b: float32\); convert them "
                                                r"with one --dtype \(e\.g\. hsgds convert --dtype float32; a collection: "
                                                r"the same hsgds convert-many command with --dtype float32\)$"):
        hsgds.PatchLoader([tmp_path / "a.zarr", tmp_path / "b.zarr"], patch_size=3, batch_size=8, device="cpu")
    with hsgds.PatchLoader([tmp_path / "a32.zarr", tmp_path / "b.zarr"], patch_size=1, batch_size=64, device="cpu",
                           normalize=None, return_coords=True, split=None) as loader:
        seen = []
        for x, _, coords in loader:
            for patch, (s, y, xx) in zip(x, coords.tolist(), strict=True):
                spectrum = (cube_a if s == 0 else cube_b)[y, xx].astype(np.float32)
                np.testing.assert_array_equal(patch.reshape(-1).numpy(), spectrum)
                seen.append((s, y, xx))
    # every labelled pixel of both scenes, each once (an empty or one-scene epoch checked nothing above)
    want = [(s, int(y), int(xx)) for s, gt in enumerate((np.load(la), np.load(lb))) for y, xx in zip(*np.nonzero(gt))]
    assert sorted(seen) == sorted(want)


def test_unlabelled_scene_is_valid(npy_scene, tmp_path):
    cp, _, cube, _ = npy_scene(h=20, w=9, b=3)
    scene = hsgds.open_scene(convert(cp, tmp_path / "u.zarr"))
    assert scene.meta.num_samples == 0 and scene.stats["train"] is None
    assert not scene.labels.any()
    np.testing.assert_allclose(scene.norm_stats.mean, cube.reshape(-1, 3).mean(0))
    assert len(scene.samples("train")[0]) == 0


def test_indian_pines_info_and_verify(indian_pines_store, run_cli):
    code, out, err = run_cli("info", indian_pines_store)
    assert code == 0, err
    assert "145x145x200 uint16" in out
    assert "16 (labels 1..16), 10249 labelled pixels" in out
    assert "Stone-Steel-Towers" in out
    code, out, err = run_cli("verify", indian_pines_store)
    assert code == 0 and out.startswith("ok: 4 tiles"), err


def test_indian_pines_roundtrip(indian_pines_store, indian_pines_arrays):
    cube, gt = indian_pines_arrays
    scene = hsgds.open_scene(indian_pines_store)
    np.testing.assert_array_equal(scene.read(0, 145, 0, 145), cube)
    np.testing.assert_array_equal(scene.labels, gt)


def _copy_store(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_verify_names_the_damaged_tile(indian_pines_store, tmp_path, run_cli, damage):
    store = _copy_store(indian_pines_store, tmp_path / "c.zarr")
    path = hsgds.open_scene(store).tile_paths[2]
    if damage == "flip":
        raw = bytearray(path.read_bytes())
        raw[1234] ^= 0x10
        path.write_bytes(bytes(raw))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-4096])
    else:
        path.unlink()
    code, out, err = run_cli("verify", store)
    assert code == 2
    assert "tile 2" in err and "1 of 4 tiles are damaged" in err
    assert "Traceback" not in err


def test_failed_conversion_leaves_nothing(npy_scene, tmp_path, monkeypatch):
    cp, lp, _, _ = npy_scene(h=60, w=60, b=4)
    import hsgds.preprocess.convert as conv

    real = conv.build_tile

    def failing(cube, grid, padding, tile_id):
        if tile_id == 2:
            raise OSError(5, "Input/output error")
        return real(cube, grid, padding, tile_id)

    monkeypatch.setattr(conv, "build_tile", failing)
    with pytest.raises(OSError):
        convert(cp, tmp_path / "x.zarr", ConvertOptions(labels=lp, tile=18))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([cp.name, lp.name])


def test_killed_conversion_leaves_no_valid_store(npy_scene, tmp_path):
    cp, lp, _, _ = npy_scene(h=60, w=60, b=4)
    out = tmp_path / "k.zarr"
    script = textwrap.dedent(f"""
        import os, signal
        from hsgds.preprocess.convert import ConvertOptions, convert
        def progress(done, total):
            if done == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        convert({str(cp)!r}, {str(out)!r}, ConvertOptions(labels={str(lp)!r}, tile=18, workers=1), progress)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9
    assert not out.exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".k.zarr.tmp-")]
    assert leftovers, "the partial conversion should be in a hidden temporary folder"
    with pytest.raises(hsgds.StoreError, match="not a complete hsgds store"):
        hsgds.open_scene(leftovers[0])
    # a rerun succeeds and verifies
    convert(cp, out, ConvertOptions(labels=lp, tile=18))
    assert hsgds.open_scene(out).verify() == []


def test_overwrite(npy_scene, tmp_path, run_cli):
    cp, lp, cube, _ = npy_scene()
    out = tmp_path / "o.zarr"
    assert run_cli("convert", cp, "-o", out)[0] == 0
    code, _, err = run_cli("convert", cp, "-o", out)
    assert code == 2 and "already exists; pass --overwrite" in err
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", out, "--overwrite")
    assert code == 0, err
    assert hsgds.open_scene(out).meta.num_samples > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_scene_open_while_its_store_is_converted_again_says_so(npy_scene, tmp_path):
    """A Scene reads labels, samples and statistics on first use, and tiles on each read. After the store was
    converted again from another cube of the same shape, the statistics and labels read were the new store's,
    with no error, and its tiles failed their checksums as 'damaged; convert the source again'. Each now says
    the store was converted again and to open it again; the store opened again reads the new cube."""
    from hsgds.errors import StoreError, TileReadError

    cp_a, lp_a, _, _ = npy_scene(seed=0)
    cp_b, lp_b, cube_b, labels_b = npy_scene(seed=1)
    out = tmp_path / "o.zarr"
    convert(cp_a, out, ConvertOptions(labels=lp_a, tile=18))
    scene = hsgds.open_scene(out)
    convert(cp_b, out, ConvertOptions(labels=lp_b, tile=18, overwrite=True))
    again = "was converted again .* since this Scene opened it; open it again"
    with pytest.raises(TileReadError, match=again):
        scene.read(0, 5, 0, 5)
    for what in ("stats", "labels", "sample_table"):
        with pytest.raises(StoreError, match=again):
            getattr(scene, what)() if what == "sample_table" else getattr(scene, what)
    assert len(scene.verify()) == 1 and "was converted again" in scene.verify()[0]  # not a line per tile
    reopened = hsgds.open_scene(out)
    np.testing.assert_array_equal(reopened.read(0, cube_b.shape[0], 0, cube_b.shape[1]), cube_b)
    np.testing.assert_array_equal(reopened.labels, labels_b)


def test_streaming_memory_is_bounded(tmp_path):
    """Converting a memory-mapped 48 MiB cube allocates a few tiles, not the cube (numpy allocations are
    visible to tracemalloc)."""
    h, w, b = 768, 512, 64
    cube = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.int16, shape=(h, w, b))
    for y in range(0, h, 64):
        cube[y:y + 64] = np.arange(y, y + 64, dtype=np.int16)[:, None, None]
    cube.flush()
    del cube
    tracemalloc.start()
    try:
        convert(tmp_path / "big.npy", tmp_path / "big.zarr", ConvertOptions(workers=2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tile_bytes = hsgds.open_scene(tmp_path / "big.zarr").grid.tile_nbytes
    assert peak < 16 * tile_bytes < h * w * b * 2, (peak, tile_bytes)


# -- bad input: exit code 2, one line on stderr, nothing left behind -----------------------------------

def _bad(tmp_path, run_cli, *args, match):
    before = set(tmp_path.iterdir())
    code, out, err = run_cli("convert", *args)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    # (a progress line comes first where the tiles were written before the error: stderr is a log here)
    lines = [line for line in err.strip().splitlines() if not line.startswith("hsgds: convert: ")]
    assert len(lines) == 1 and lines[0].startswith(("hsgds: error:", "Error:")), err
    assert match in err, err
    assert set(tmp_path.iterdir()) == before, "bad input must leave nothing behind"


def test_bad_unknown_format(tmp_path, run_cli):
    (tmp_path / "notes.txt").write_text("hello")
    _bad(tmp_path, run_cli, tmp_path / "notes.txt", "-o", tmp_path / "o.zarr", match="notes.txt")


def test_bad_missing_source(tmp_path, run_cli):
    _bad(tmp_path, run_cli, tmp_path / "nope.npy", "-o", tmp_path / "o.zarr", match="nope.npy")


def test_bad_nan_refused_then_filled(tmp_path, run_cli):
    cube = np.random.default_rng(0).random((20, 20, 3)).astype(np.float32)
    cube[17, 3, 1] = np.nan
    np.save(tmp_path / "nan.npy", cube)
    _bad(tmp_path, run_cli, tmp_path / "nan.npy", "-o", tmp_path / "o.zarr", match="--nan-fill")
    code, _, err = run_cli("convert", tmp_path / "nan.npy", "-o", tmp_path / "o.zarr", "--nan-fill", "0")
    assert code == 0, err
    got = hsgds.open_scene(tmp_path / "o.zarr").read(0, 20, 0, 20)
    assert got[17, 3, 1] == 0 and np.isfinite(got).all()


def test_bad_labels_shape(npy_scene, tmp_path, run_cli):
    cp, _, _, _ = npy_scene()
    np.save(tmp_path / "gt_small.npy", np.ones((5, 5), np.uint8))
    _bad(tmp_path, run_cli, cp, "--labels", tmp_path / "gt_small.npy", "-o", tmp_path / "o.zarr",
         match="labels gt_small.npy have shape (5, 5)")


def test_bad_dtype(tmp_path, run_cli):
    np.save(tmp_path / "c.npy", np.zeros((8, 8, 2), np.complex64))
    _bad(tmp_path, run_cli, tmp_path / "c.npy", "-o", tmp_path / "o.zarr", match="complex64")


def test_bad_even_patch_and_tile(npy_scene, tmp_path, run_cli):
    cp, _, _, _ = npy_scene(b=3)
    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "o.zarr", "--max-patch", "12", match="odd")
    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "o.zarr", "--tile", "10", match="not a multiple of 4096")


def test_bad_output_folder_missing(npy_scene, tmp_path, run_cli):
    cp, _, _, _ = npy_scene(b=3)
    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "no" / "o.zarr", match="does not exist")


# -- splits through the converter ----------------------------------------------------------------------

def test_block_split_guard_holds_in_store(npy_scene, tmp_path, run_cli):
    cp, lp, _, labels = npy_scene(h=96, w=80, b=3, seed=2)
    out = tmp_path / "b.zarr"
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", out, "--split", "blocks", "--block-size", "24",
                           "--train", "0.5", "--max-patch", "7")
    assert code == 0, err
    scene = hsgds.open_scene(out)
    r = 3
    ty, tx, _ = scene.samples("train")
    test_map = np.zeros(labels.shape, bool)
    for split in ("val", "test"):
        yy, xx, _ = scene.samples(split)
        test_map[yy, xx] = True
    assert len(ty) and test_map.any()
    for y, x in zip(ty, tx):
        assert not test_map[max(0, y - r):y + r + 1, max(0, x - r):x + r + 1].any()
    code, out_text, _ = run_cli("info", out)
    assert "method=blocks" in out_text and "none" in out_text


def test_mask_split(npy_scene, tmp_path, run_cli):
    cp, lp, _, labels = npy_scene(seed=4)
    train = np.zeros(labels.shape, np.uint8)
    train[:, :10] = 1
    test = np.zeros(labels.shape, np.uint8)
    test[:, 15:] = 1
    np.save(tmp_path / "train.npy", train)
    np.save(tmp_path / "test.npy", test)
    out = tmp_path / "m.zarr"
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", out, "--split", "masks",
                           "--train-mask", tmp_path / "train.npy", "--test-mask", tmp_path / "test.npy")
    assert code == 0, err
    scene = hsgds.open_scene(out)
    y, x, _ = scene.samples("train")
    assert len(y) == np.count_nonzero(labels[:, :10]) and (x < 10).all()
    y, x, _ = scene.samples("test")
    assert len(y) == np.count_nonzero(labels[:, 15:]) and (x >= 15).all()
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "m2.zarr", "--split", "masks",
         "--train-mask", tmp_path / "train.npy", match="--test-mask")


@pytest.mark.parametrize("values, match", [
    (np.array([-1, 1]), "train mask train.npy holds negative values (min -1); a mask holds 0 outside the split and 1 "
                        "(any positive whole number) in it"),
    (np.array([0.0, np.nan]), "train mask train.npy holds NaN or infinity (replace them with 0); a mask holds 0"),
    (np.array([0.0, 0.5]), "train mask train.npy holds non-integer values (e.g. 0.5); a mask holds 0"),
])
def test_a_bad_mask_is_named_as_a_mask(npy_scene, tmp_path, run_cli, values, match):
    """A mask's bad values were reported as "labels in train.npy ... class ids must be >= 0 (0 = unlabeled)":
    the error now names the mask and says what a mask holds."""
    cp, lp, _, labels = npy_scene(b=3)
    np.save(tmp_path / "train.npy", values[(labels > 0).astype(int)])  # the second value on the labelled pixels
    np.save(tmp_path / "test.npy", (labels > 0).astype(np.uint8))
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--split", "masks",
         "--train-mask", tmp_path / "train.npy", "--test-mask", tmp_path / "test.npy", match=match)


def test_mask_shape_and_overlap_errors_name_the_options_as_typed(npy_scene, tmp_path, run_cli):
    """`hsgds convert --split masks`: a mask of another shape than the labels, or masks that overlap, were named
    by mask_split's Python parameters (`test_mask has shape ...`, `train_mask & test_mask: 12`) where the user
    typed --test-mask; the one-line error names the options and files (the overlap counted by numpy), while
    mask_split itself keeps its parameter names for API callers."""
    from hsgds.errors import InputError
    from hsgds.preprocess.splits import mask_split

    cp, lp, _, labels = npy_scene(b=3)
    train = np.zeros(labels.shape, np.uint8)
    train[:, :12] = 1
    test = np.zeros(labels.shape, np.uint8)
    test[:, 9:] = 1  # columns 9-11 in both
    np.save(tmp_path / "tm.npy", train)
    np.save(tmp_path / "te.npy", test)
    np.save(tmp_path / "small.npy", test[:-1])
    both = int(np.count_nonzero(train & test))
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--split", "masks",
         "--train-mask", tmp_path / "tm.npy", "--test-mask", tmp_path / "small.npy",
         match=f"--test-mask small.npy has shape {test[:-1].shape} but --labels {lp.name} has shape {labels.shape}; "
               "masks must match the label map pixel for pixel")
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--split", "masks",
         "--train-mask", tmp_path / "tm.npy", "--test-mask", tmp_path / "te.npy",
         match=f"{both} pixels are in more than one split mask (--train-mask tm.npy & --test-mask te.npy: {both}); "
               "make the masks disjoint")
    with pytest.raises(InputError, match=rf"\(train_mask & test_mask: {both}\)"):  # the API's own words
        mask_split(labels, train_mask=train, test_mask=test)


def test_cli_usage_error_exit_2(run_cli):
    code, _, err = run_cli("convert")
    assert code == 2 and "Missing argument" in err


def test_env_does_not_leak_cufile_log():
    assert os.environ.get("CUFILE_LOGFILE_PATH")


def test_bad_seed_patch_and_block_size(npy_scene, tmp_path, run_cli):
    cp, lp, _, _ = npy_scene(b=3)
    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "o.zarr", "--seed", "-1", match="--seed must be a non-negative")
    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "o.zarr", "--max-patch", "1027", match="larger than a store can serve")
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--split", "blocks", "--block-size", "0",
         match="--block-size must be a positive")
    # in the command's words (it named block_size and guard 5): the guard is the halo --max-patch 11 sets
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--split", "blocks", "--block-size", "2",
         "--max-patch", "11",
         match="hsgds: error: --block-size 2 is too small for --max-patch 11: blocks must be at least 3 pixels (each "
               "is guarded by the patch halo of 5 pixels; smaller blocks make the guard bookkeeping explode); pass "
               "--block-size 3 or more, or a smaller --max-patch\n")
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--split", "blocks",
                           "--block-size", "3", "--max-patch", "11")
    assert code == 0, err


# -- values a store cannot hold faithfully: refused in one line, before anything is renamed into place ----

@pytest.mark.parametrize("dtype, fill, fits", [("float32", "1e39", False), ("float32", "-3.5e38", False),
                                               ("float32", "3e38", True), ("float64", "-1e100", True)])
def test_nan_fill_must_fit_the_cube_dtype(tmp_path, run_cli, dtype, fill, fits):
    cube = np.random.default_rng(0).random((12, 12, 2)).astype(dtype)
    cube[5, 5, 1] = np.nan
    np.save(tmp_path / "nan.npy", cube)
    if not fits:  # it used to overflow to inf silently: a store with inf values and NaN statistics
        _bad(tmp_path, run_cli, tmp_path / "nan.npy", "-o", tmp_path / "o.zarr", "--nan-fill", fill,
             match=f"does not fit the cube's {dtype} values (finite range -{float(np.finfo(dtype).max):.8g}")
        return
    code, _, err = run_cli("convert", tmp_path / "nan.npy", "-o", tmp_path / "o.zarr", "--nan-fill", fill)
    assert code == 0, err
    scene = hsgds.open_scene(tmp_path / "o.zarr")
    assert scene.read(0, 12, 0, 12)[5, 5, 1] == np.asarray(float(fill)).astype(dtype)
    assert np.isfinite(scene.stats["all"].std).all()


def test_nan_fill_does_not_apply_to_integer_cubes(npy_scene, tmp_path, run_cli):
    cp, _, cube, _ = npy_scene(b=3)  # int16: no NaN to fill, so any value leaves the tiles as they are
    code, _, err = run_cli("convert", cp, "-o", tmp_path / "o.zarr", "--nan-fill", "1e39")
    assert code == 0, err
    assert np.array_equal(hsgds.open_scene(tmp_path / "o.zarr").read(0, cube.shape[0], 0, cube.shape[1]), cube)


@pytest.mark.parametrize("scale, bad", [(1e160, True), (1e140, False)])
def test_statistics_that_overflow_float64_are_refused(npy_scene, tmp_path, run_cli, scale, bad):
    cp, lp, cube, _ = npy_scene(b=3)
    big = cube.astype(np.float64) * scale
    np.save(tmp_path / "big.npy", big)
    args = (tmp_path / "big.npy", "--labels", lp, "-o", tmp_path / "o.zarr")
    if bad:  # the std overflowed to inf and the loader then yielded NaN patches
        _bad(tmp_path, run_cli, *args, match="band 0: the std of the scene's pixels is inf")
        assert "too large for float64 band statistics); rescale the cube" in run_cli("convert", *args)[2]
        return
    code, _, err = run_cli("convert", *args)
    # no overflow warning either: the progress line alone (stderr is a log here)
    assert code == 0 and err.startswith("hsgds: convert: 1 of 1 tiles done") and err.count("\n") == 1, err
    stats = hsgds.open_scene(tmp_path / "o.zarr").stats["all"]
    np.testing.assert_allclose(stats.std, big.reshape(-1, 3).std(axis=0), rtol=1e-12)


def test_labels_above_the_uint16_range_are_refused(npy_scene, tmp_path, run_cli):
    cp, lp, _, labels = npy_scene(b=3)
    for top in (65536, 2**32 + 2, 2**40):  # used to wrap: 2**32 + 2 merged into class 2, 2**40 became 0
        wide = labels.astype(np.int64)
        wide[labels == 2] = top
        np.save(tmp_path / "wide.npy", wide)
        _bad(tmp_path, run_cli, cp, "--labels", tmp_path / "wide.npy", "-o", tmp_path / "o.zarr",
             match=f"labels wide.npy hold class id {top}, above the largest a store holds (65535)")
    wide = labels.astype(np.int64)
    wide[labels == 2] = 65535
    np.save(tmp_path / "wide.npy", wide)
    store = convert(cp, tmp_path / "o.zarr", ConvertOptions(labels=tmp_path / "wide.npy", train=0.5))
    scene = hsgds.open_scene(store)
    assert scene.num_classes == 65535 and np.array_equal(scene.labels, wide)
    # the loader's class index (label - 1) holds every class id a store can: 65534 for label 65535
    with hsgds.PatchLoader(store, patch_size=3, batch_size=4096, split=None, device="cpu", shuffle=False) as loader:
        got = np.concatenate([y.numpy() for _, y in loader])
    want = wide[wide > 0] - 1
    assert sorted(got.tolist()) == sorted(want.tolist())


@pytest.mark.parametrize("args, match", [
    (("--split", "blocks", "--block-size", "100000"), "--split blocks gives no train pixel on these labels; use a "
                                                       "smaller --block-size than 100000"),
    (("--split", "masks", "--train-mask", "{empty}", "--test-mask", "{full}"), "--train-mask covers none of the "
                                                                              "labelled pixels"),
])
def test_split_without_train_pixels_is_refused(npy_scene, tmp_path, run_cli, args, match):
    cp, lp, _, labels = npy_scene(b=3)
    np.save(tmp_path / "empty.npy", np.zeros(labels.shape, np.uint8))
    np.save(tmp_path / "full.npy", np.ones(labels.shape, np.uint8))
    args = [str(a).format(empty=tmp_path / "empty.npy", full=tmp_path / "full.npy") for a in args]
    code, out, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "o.zarr", *args)
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"hsgds: error: {match}"), err
    assert not (tmp_path / "o.zarr").exists() and not list(tmp_path.glob(".o.zarr*"))


# -- options: named when wrong, refused when they would be ignored --------------------------------------

@pytest.mark.parametrize("args, match", [
    (("--train", "1.5"), "--train fraction must be in (0, 1), got 1.5"),  # refused with or without --labels
    (("--val", "0.95"), "train + val fractions must be below 1"),
    (("--split", "blocks"), "--split blocks needs --labels"),
    (("--block-size", "8", "--seed", "3"), "--block-size needs --labels (splits and class names are about "
                                           "labelled pixels); pass the ground truth with --labels, or drop "
                                           "--block-size --seed"),
    (("--train", "0.2"), "--train needs --labels"),
    (("--class-names", "a,b"), "--class-names needs --labels"),
    (("--split", "masks", "--train-mask", "m.npy", "--test-mask", "m.npy"), "--split masks needs --labels"),
    (("--class-names", ",,"), "--class-names has an empty name (',,')"),
    (("--workers", "0"), "--workers must be >= 1, got 0"),
])
def test_label_options_without_labels_or_bad_values(npy_scene, tmp_path, run_cli, args, match):
    cp, _, _, _ = npy_scene(b=3)
    np.save(tmp_path / "m.npy", np.ones((37, 29), np.uint8))
    args = [str(tmp_path / a) if a == "m.npy" else a for a in args]
    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "o.zarr", *args, match=match)


@pytest.mark.parametrize("args, match", [
    # a random split (every test patch overlapping train patches) where blocks were meant
    (("--block-size", "8"), "--block-size means nothing with --split random (only --split blocks cuts the scene "
                            "into blocks); pass --split blocks, or drop --block-size"),
    (("--split", "masks", "{masks}", "--train", "0.3"), "--train means nothing with --split masks: the masks decide "
                                                        "the split (a val split: --val-mask); drop --train"),
    (("--split", "masks", "{masks}", "--val", "0.1"), "--val means nothing with --split masks"),  # no val split made
    (("--split", "masks", "{masks}", "--seed", "3", "--block-size", "8"), "--block-size --seed mean nothing with "
                                                                         "--split masks"),
])
def test_split_options_the_split_would_ignore_are_refused(npy_scene, tmp_path, run_cli, args, match):
    """Options the split method does not read were ignored without a word; they are refused in one line, naming
    every such option, before anything is written."""
    cp, lp, _, labels = npy_scene(b=3)
    np.save(tmp_path / "train.npy", (labels > 0) & (np.arange(labels.shape[1]) < 10))
    np.save(tmp_path / "test.npy", (labels > 0) & (np.arange(labels.shape[1]) >= 10))
    masks = ("--train-mask", tmp_path / "train.npy", "--test-mask", tmp_path / "test.npy")
    args = [x for a in args for x in (masks if a == "{masks}" else (a,))]
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", *args, match=match)
    # the converter's own options say so too, for what they can tell was given
    for opts in (ConvertOptions(labels=lp, block_size=8),
                 ConvertOptions(labels=lp, split="masks", train_mask=tmp_path / "train.npy",
                                test_mask=tmp_path / "test.npy", val=0.1)):
        with pytest.raises(hsgds.errors.ConfigError, match="means nothing with --split"):
            opts.check()
    ConvertOptions(block_size=8).check()  # no labels, no split: the command says "--block-size needs --labels"


def test_defaults_equal_to_given_values_are_not_label_options(npy_scene, tmp_path, run_cli):
    cp, _, _, _ = npy_scene(b=3)  # only what the user typed counts: no split option given, none refused
    code, _, err = run_cli("convert", cp, "-o", tmp_path / "o.zarr", "--max-patch", "5")
    assert code == 0, err


@pytest.mark.parametrize("names, match", [
    ("a,b,c,d", "--class-names lists 4 names but the labels hold class 5; give one name per class, in label order"),
    ("a,,c,d,e", "--class-names has an empty name ('a,,c,d,e')"),
])
def test_class_names_must_name_every_class_once(npy_scene, tmp_path, run_cli, names, match):
    cp, lp, _, labels = npy_scene(b=3)
    assert labels.max() == 5
    _bad(tmp_path, run_cli, cp, "--labels", lp, "-o", tmp_path / "o.zarr", "--class-names", names, match=match)


def test_class_names_may_name_classes_a_scene_lacks(npy_scene, tmp_path, run_cli):
    """A scene of a campaign holds only some of its classes: --class-names naming more classes than the
    labels reach gives the store every named class (num_classes = the names), so scenes converted with the
    campaign's names load together whatever classes each holds."""
    cp, lp, _, labels = npy_scene(b=3, seed=0)
    cp1, lp1, _, labels1 = npy_scene(b=3, seed=1)
    np.save(lp1, np.where(labels1 == 5, 0, labels1))  # the second scene lacks class 5
    names = "a,b,c,d,e,f"  # and the campaign has a sixth class neither holds
    for src, gt, out in ((cp, lp, "0.zarr"), (cp1, lp1, "1.zarr")):
        code, _, err = run_cli("convert", src, "--labels", gt, "-o", tmp_path / out, "--class-names", names,
                               "--max-patch", "3")
        assert code == 0, err
        scene = hsgds.open_scene(tmp_path / out)
        assert (scene.num_classes, scene.class_names) == (6, list("abcdef"))
        assert scene.verify() == []
    with hsgds.PatchLoader([tmp_path / "0.zarr", tmp_path / "1.zarr"], patch_size=3, batch_size=64,
                           device="cpu") as loader:
        counts = loader.class_counts()
        assert len(counts) == 6 and counts[5] == 0 and sum(1 for _ in loader) == len(loader)
    code, out, _ = run_cli("info", tmp_path / "1.zarr")
    assert code == 0 and "classes:    4 (labels 1..6)" in out, out  # (4 of the 6 classes hold pixels)


def test_option_values_are_named_in_their_errors(npy_scene, tmp_path, run_cli):
    cp, lp, _, _ = npy_scene(b=3)
    code, _, err = run_cli("convert", cp, "-o", tmp_path / "o.zarr", "--train", "abc")
    assert code == 2 and "Invalid value for '--train': 'abc' is not a number" in err, err
    # a tile over the 2 GiB limit: the suggestion must itself be accepted
    from hsgds.preprocess.convert import _tile_size

    _bad(tmp_path, run_cli, cp, "-o", tmp_path / "o.zarr", "--tile", "100000",
         match="over the 2 GiB tile limit; use --tile 18866 or smaller")
    side = 18866 + 14  # int16, 3 bands: the largest side that is a multiple of 64 (4 KiB-aligned) within 2 GiB
    assert side % 64 == 0 and side * side * 6 <= 2**31 < (side + 64) ** 2 * 6
    assert _tile_size(ConvertOptions(tile=18866), (37, 29, 3), 2) == 18866  # the suggestion is accepted
    _bad(tmp_path, run_cli, cp, "--labels", lp, "--labels-key", "gt", "-o", tmp_path / "o.zarr",
         match="--labels-key selects a variable in .mat or HDF5 files; gt0.npy is NumPy .npy, drop --labels-key")
    (tmp_path / "gt_empty.npy").write_bytes(b"")
    _bad(tmp_path, run_cli, cp, "--labels", tmp_path / "gt_empty.npy", "-o", tmp_path / "o.zarr",
         match="gt_empty.npy is empty; re-export the label map")


@pytest.mark.parametrize("fmt", ["mat", "mat73", "h5"])
def test_a_label_or_mask_variable_is_chosen_by_the_option_the_error_names(npy_scene, tmp_path, run_cli, fmt):
    """A label file's variable is chosen with --labels-key, not --key (the cube's); no option chooses a mask's:
    the errors said "choose one with --key" for both, which picked another variable of the cube file."""
    import h5py
    import scipy.io

    from tests.preprocess.test_readers import save_mat73

    cp, lp, _, _ = npy_scene(b=3)
    gt = np.load(lp)
    arrays = {"gt": gt.astype(np.float64), "other": gt.astype(np.float64)}
    path = tmp_path / f"two.{'h5' if fmt == 'h5' else 'mat'}"
    if fmt == "mat":
        scipy.io.savemat(path, arrays)
    elif fmt == "mat73":
        save_mat73(path, arrays)
    else:
        with h5py.File(path, "w") as f:
            for name, a in arrays.items():
                f[name] = a
    _bad(tmp_path, run_cli, cp, "--labels", path, "-o", tmp_path / "o.zarr",
         match="holds several 2-D arrays (gt (37, 29), other (37, 29)); choose one with --labels-key")
    _bad(tmp_path, run_cli, cp, "--labels", path, "--labels-key", "nope", "-o", tmp_path / "o.zarr",
         match="choose one with --labels-key")
    _bad(tmp_path, run_cli, cp, "--labels", path, "--labels-key", "gt", "-o", tmp_path / "o.zarr", "--split", "masks",
         "--train-mask", path, "--test-mask", path,
         match="holds several 2-D arrays (gt (37, 29), other (37, 29)); no option chooses one: save the 2-D array in "
               "a file of its own")
    code, _, err = run_cli("convert", cp, "--labels", path, "--labels-key", "other", "-o", tmp_path / "o.zarr")
    assert code == 0, err
    assert np.array_equal(hsgds.open_scene(tmp_path / "o.zarr").labels, gt)


def test_unwritable_output_folder_is_named(npy_scene, tmp_path, run_cli):
    cp, _, _, _ = npy_scene(b=3)
    code, _, err = run_cli("convert", cp, "-o", "/proc/a.zarr")  # a virtual file system: ENOENT, as root too
    assert code == 2 and err.strip() == ("hsgds: error: cannot write /proc/a.zarr: its folder /proc is not writable "
                                         "(No such file or directory); choose another -o"), err


def test_band_first_hdf5_suggests_the_band_axis(tmp_path, run_cli):
    import h5py

    from hsgds.synthetic import make_scene

    cube, labels = make_scene(100, 100, 48, classes=3, dtype="int16", seed=0)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["cube"] = np.moveaxis(cube, 2, 0)  # (B, H, W)
    np.save(tmp_path / "gt.npy", labels)
    _bad(tmp_path, run_cli, tmp_path / "c.h5", "--labels", tmp_path / "gt.npy", "-o", tmp_path / "o.zarr",
         match="labels gt.npy have shape (100, 100), but the cube is 48x100; if the cube's bands are its first "
               "axis, pass --band-axis first")
    code, _, err = run_cli("convert", tmp_path / "c.h5", "--labels", tmp_path / "gt.npy", "-o", tmp_path / "o.zarr",
                           "--band-axis", "first")
    assert code == 0, err
    assert np.array_equal(hsgds.open_scene(tmp_path / "o.zarr").read(0, 100, 0, 100), cube)


def test_micrometres_labelled_as_nanometres_are_not_recorded_and_said_once(npy_scene, tmp_path, run_cli):
    """A header whose 'Nanometers' are micrometres (0.4-0.43) would record band centres that match no other
    scene's: the store records none, the conversion says why in one line and goes on, `hsgds info` says the
    same, and --wavelengths then records the right ones."""
    from tests.envi import write_envi

    _, lp, cube, _ = npy_scene(b=4)
    src = write_envi(tmp_path / "e.hdr", cube, wavelengths=[0.4, 0.41, 0.42, 0.43])
    code, out, err = run_cli("convert", src, "--labels", lp, "-o", tmp_path / "a.zarr")
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("hsgds: warning:")]
    assert warned == ["hsgds: warning: e.hdr: its wavelengths read as 0.4-0.43 nm (units Nanometers), "
                      "outside 100-20000 nm; the store records no wavelengths (to match bands by wavelength, give "
                      "the band centres in nm with --wavelengths or fix the header)"], err
    assert "Traceback" not in err and "WavelengthWarning" not in err
    assert hsgds.open_scene(tmp_path / "a.zarr").wavelengths is None
    assert np.array_equal(hsgds.open_scene(tmp_path / "a.zarr").read(0, cube.shape[0], 0, cube.shape[1]), cube)
    code, out, err = run_cli("info", src)
    assert code == 0 and ("bands:      4 bands, not recorded: its wavelengths read as 0.4-0.43 nm (units "
                          "Nanometers), outside 100-20000 nm (give them with --wavelengths") in out, out + err
    code, _, err = run_cli("convert", src, "--labels", lp, "-o", tmp_path / "b.zarr", "--wavelengths", "400,410,420,430")
    assert code == 0 and "warning" not in err, err
    assert hsgds.open_scene(tmp_path / "b.zarr").wavelengths == [400.0, 410.0, 420.0, 430.0]


def test_a_prisma_cubes_band_centres_are_the_stores_in_its_own_descending_order(tmp_path, run_cli):
    """A PRISMA L2D file's VNIR_Cube, (rows, bands, columns), converted with --band-axis middle: the store (read
    with zarr-python) records the file's List_Cw_Vnir as they are, descending, and a loader's wavelengths=[...]
    takes each one's nearest band; the product's unused bands (flag 0, centre 0) are null in the store, with no
    warning, and `hsgds info` (store and source) names them after the span of the others; --wavelengths may
    give them a centre but not contradict the file's. A store records the oldest format that describes it: v4
    with a band without a centre, else v2."""
    from hsgds.synthetic import make_scene
    from tests.sensors import PRISMA_VNIR, write_prisma

    vnir, labels = make_scene(30, 26, 6, classes=3, dtype="uint16", seed=4)
    swir, _ = make_scene(30, 26, 4, classes=3, dtype="uint16", seed=5)
    np.save(tmp_path / "gt.npy", labels)
    nm = [960.5, 850.25, 700.0, 610.0, 520.75, 410.0]
    src = write_prisma(tmp_path / "PRS_L2D_STD_0001.he5", vnir, swir, nm, [2400.0, 2000.0, 1500.0, 1000.0])
    args = ("--key", PRISMA_VNIR, "--band-axis", "middle", "--labels", tmp_path / "gt.npy")
    code, _, err = run_cli("convert", src, *args, "-o", tmp_path / "p.zarr")
    assert code == 0 and "warning" not in err, err
    record = zarr.open_group(tmp_path / "p.zarr", mode="r").attrs["hsgds"]
    assert record["wavelengths"] == np.asarray(nm, np.float32).astype(np.float64).tolist()
    # every band has a centre (and no nodata record): format v2, the oldest that describes it, which an hsgds
    # reading v1 to v3 reads
    assert record["format_version"] == 2 and record["nodata"] is None
    assert np.array_equal(hsgds.open_scene(tmp_path / "p.zarr").read(0, 30, 0, 26), vnir)
    # nearest bands of 413, 607 and 957 nm: 5, 3 and 0
    with hsgds.PatchLoader(tmp_path / "p.zarr", patch_size=3, batch_size=16, wavelengths=[413, 607, 957],
                           shuffle=False, device="cpu", normalize=None) as by_nm, \
            hsgds.PatchLoader(tmp_path / "p.zarr", patch_size=3, batch_size=16, bands=[5, 3, 0], shuffle=False,
                              device="cpu", normalize=None) as by_index:
        assert all(np.array_equal(a[0], b[0]) for a, b in zip(by_nm, by_index))
    code, out, err = run_cli("info", tmp_path / "p.zarr")
    assert code == 0 and "bands:      410.0-960.5 nm (descending)" in out, out + err
    code, _, err = run_cli("convert", src, *args, "-o", tmp_path / "x.zarr", "--wavelengths", "400,500,600,700,800,900")
    assert code == 2 and "records its own wavelengths (410-960.5 nm), which --wavelengths contradicts" in err, err

    # the product's unused bands (flag 0, centre 0): null in the store, the other bands' centres recorded
    write_prisma(src, vnir, swir, [0.0, 0.0, *nm[2:]], [2400.0, 2000.0, 1500.0, 1000.0], flags_vnir=[0, 0, 1, 1, 1, 1])
    code, _, err = run_cli("convert", src, *args, "-o", tmp_path / "u.zarr")
    assert code == 0 and "warning" not in err, err
    record = zarr.open_group(tmp_path / "u.zarr", mode="r").attrs["hsgds"]
    assert record["wavelengths"] == [None, None, *np.asarray(nm[2:], np.float32).astype(np.float64).tolist()]
    assert record["format_version"] == 4  # (an older hsgds refuses it by its version, not as damaged metadata)
    assert hsgds.open_scene(tmp_path / "u.zarr").verify() == []
    code, out, err = run_cli("info", tmp_path / "u.zarr")
    assert code == 0 and "bands:      410.0-700.0 nm (descending); bands 0, 1 have no centre (unused)\n" in out, out
    code, out, err = run_cli("info", src, "--key", PRISMA_VNIR, "--band-axis", "middle")
    assert code == 0 and ("bands:      6 bands, 410.0-700.0 nm (descending); bands 0, 1 have no centre "
                          "(unused)\n") in out, out + err
    # --wavelengths that agree with every centre the file records may give the unused bands one, or none
    filled = "965,955,700,610,520.75,410"
    code, _, err = run_cli("convert", src, *args, "-o", tmp_path / "f.zarr", "--wavelengths", filled)
    assert code == 0 and "warning" not in err, err
    assert hsgds.open_scene(tmp_path / "f.zarr").wavelengths == [965.0, 955.0, 700.0, 610.0, 520.75, 410.0]
    assert zarr.open_group(tmp_path / "f.zarr", mode="r").attrs["hsgds"]["format_version"] == 2  # every band centred
    code, _, err = run_cli("convert", src, *args, "-o", tmp_path / "n.zarr", "--wavelengths",
                           "none,nan,700,610,520.75,410")
    assert code == 0 and "warning" not in err, err
    assert hsgds.open_scene(tmp_path / "n.zarr").wavelengths == [None, None, 700.0, 610.0, 520.75, 410.0]
    assert zarr.open_group(tmp_path / "n.zarr", mode="r").attrs["hsgds"]["format_version"] == 4
    for given in ("965,955,700,610,520.75,411", "965,955,none,610,520.75,410"):
        code, _, err = run_cli("convert", src, *args, "-o", tmp_path / "x.zarr", "--wavelengths", given)
        assert code == 2 and err.strip().endswith("PRS_L2D_STD_0001.he5 records its own wavelengths (410-700 nm), "
                                                  "which --wavelengths contradicts; drop --wavelengths"), err


def test_an_enmap_images_metadata_file_gives_its_centres_and_is_part_of_its_source(tmp_path, run_cli):
    """An EnMAP L2A image converted beside its METADATA.XML: the store records the file's band centres, and its
    source record (read with zarr-python) lists the image and the metadata file, hashed together (hashlib here);
    a metadata file listing another number of bands gives a one-line warning and no wavelengths."""
    import hashlib

    from hsgds.synthetic import make_scene
    from tests.sensors import ENMAP_L2A, enmap_xml, write_enmap

    cube, labels = make_scene(24, 20, 5, classes=3, dtype="int16", seed=6)
    np.save(tmp_path / "gt.npy", labels)
    centres = ["418.416", "550.5", "880.0", "1200.25", "2445.53"]
    src = write_enmap(tmp_path, cube, enmap_xml(centres))
    xml = tmp_path / f"{ENMAP_L2A}-METADATA.XML"
    code, _, err = run_cli("convert", src, "--labels", tmp_path / "gt.npy", "-o", tmp_path / "e.zarr")
    assert code == 0 and "warning" not in err, err
    record = zarr.open_group(tmp_path / "e.zarr", mode="r").attrs["hsgds"]
    assert record["wavelengths"] == [418.416, 550.5, 880.0, 1200.25, 2445.53]
    data = src.read_bytes() + xml.read_bytes()
    assert {k: record["source"][k] for k in ("name", "files", "size", "sha256")} == {
        "name": src.name, "files": [src.name, xml.name], "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert np.array_equal(hsgds.open_scene(tmp_path / "e.zarr").read(0, 24, 0, 20), cube)

    xml.write_text(enmap_xml(centres[:4]))
    code, _, err = run_cli("convert", src, "--labels", tmp_path / "gt.npy", "-o", tmp_path / "m.zarr")
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("hsgds: warning:")]
    assert warned == [f"hsgds: warning: {xml.name}: it lists 4 band centres for the image's 5 bands; the store "
                      "records no wavelengths (to match bands by wavelength, give the band centres in nm with "
                      "--wavelengths or fix the header)"], err
    assert zarr.open_group(tmp_path / "m.zarr", mode="r").attrs["hsgds"]["wavelengths"] is None


def test_a_line_interleaved_hdf5_suggests_band_axis_middle(tmp_path, run_cli):
    """A PRISMA-style (rows, bands, columns) dataset read as (H, W, B) has the wrong size: the error names the
    band axis that makes the labels fit, and with it the store holds the cube."""
    import h5py

    from hsgds.synthetic import make_scene

    cube, labels = make_scene(60, 70, 24, classes=3, dtype="uint16", seed=1)
    with h5py.File(tmp_path / "prisma.he5", "w") as f:
        f["VNIR_Cube"] = cube.transpose(0, 2, 1)  # (H, B, W)
    np.save(tmp_path / "gt.npy", labels)
    _bad(tmp_path, run_cli, tmp_path / "prisma.he5", "--labels", tmp_path / "gt.npy", "-o", tmp_path / "o.zarr",
         match="labels gt.npy have shape (60, 70), but the cube is 60x24; if the cube's bands are its middle "
               "axis, pass --band-axis middle")
    code, _, err = run_cli("convert", tmp_path / "prisma.he5", "--labels", tmp_path / "gt.npy", "-o",
                           tmp_path / "o.zarr", "--band-axis", "middle")
    assert code == 0, err
    scene = hsgds.open_scene(tmp_path / "o.zarr")
    assert scene.shape == (60, 70, 24)
    assert np.array_equal(scene.read(0, 60, 0, 70), cube)
    assert np.array_equal(scene.labels, labels)


def test_a_warning_other_than_a_split_is_shown_once_and_conversion_completes(tmp_path):
    """A GeoTIFF with a user-defined CRS converted without rasterio: the reader's warning is not a split's,
    and re-raising it inside the recording used to loop for ever (hsgds.cli._split_warnings)."""
    from rasterio.transform import Affine

    from tests.preprocess.test_georeference import ALBERS, write_geotiff

    cube = np.arange(12 * 10 * 3, dtype=np.int16).reshape(12, 10, 3)
    write_geotiff(tmp_path / "c.tif", cube.transpose(2, 0, 1), ALBERS, Affine(30.0, 0.0, 100.0, 0.0, -30.0, 200.0))
    script = ("import sys; sys.modules['rasterio'] = None\n"  # as if hsgds[geo] were not installed
              "from hsgds.cli import main\n"
              f"main(['convert', {str(tmp_path / 'c.tif')!r}, '-o', {str(tmp_path / 'o.zarr')!r}])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("has a user-defined coordinate reference system") == 1, done.stderr
    assert "wrote" in done.stdout and np.array_equal(hsgds.open_scene(tmp_path / "o.zarr").read(0, 12, 0, 10), cube)


def _user_crs_tiff(path):
    """A GeoTIFF whose CRS is user-defined (no EPSG code): read without rasterio, its reader warns."""
    from rasterio.transform import Affine

    from tests.preprocess.test_georeference import ALBERS, write_geotiff

    write_geotiff(path, np.ones((3, 12, 10), np.int16), ALBERS, Affine(30.0, 0.0, 100.0, 0.0, -30.0, 200.0))
    return path


def test_a_readers_warning_under_a_command_is_one_escaped_line_once(tmp_path):
    """An HsgdsWarning that no command shows itself (a source reader's) is one `hsgds: warning:` line on stderr,
    its control characters escaped, not Python's `file:line: Category: text` and source line."""
    src = _user_crs_tiff(tmp_path / "a\nb.tif")  # a newline in the name: escaped in the line
    script = ("import sys; sys.modules['rasterio'] = None\n"  # as if hsgds[geo] were not installed
              "from hsgds.cli import main\n"
              f"main(['info', {str(src)!r}])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "hsgds: warning: a\\nb.tif has a user-defined coordinate reference system; recording it needs rasterio "
        '(pip install "hsgds[geo]"), so the store keeps its transform only'], done.stderr
    assert "georef:     no CRS (transform only)" in done.stdout


def test_the_users_warning_filters_silence_hsgds_warnings_on_the_cli(tmp_path):
    """`python -W ignore` (or PYTHONWARNINGS=ignore) silences hsgds's warnings under a command, as any other; a
    filter for another category leaves them shown, once, on one line."""
    src = _user_crs_tiff(tmp_path / "d.tif")
    script = ("import sys; sys.modules['rasterio'] = None\n"
              "from hsgds.cli import main\n"
              f"main(['info', {str(src)!r}])")
    for flags, want in ((["-W", "ignore"], []), (["-W", "ignore::DeprecationWarning"], 1)):
        done = subprocess.run([sys.executable, *flags, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        lines = done.stderr.splitlines()
        assert lines == want if isinstance(want, list) else (len(lines) == want and "user-defined coordinate" in
                                                              lines[0] and lines[0].startswith("hsgds: warning:")), lines


def test_a_readers_warning_in_the_library_stays_a_python_warning(tmp_path, monkeypatch):
    """Outside the CLI the reader's warning is a normal Python warning (an HsgdsWarning, a UserWarning)."""
    from hsgds.errors import HsgdsWarning
    from hsgds.preprocess.describe import describe_source

    src = _user_crs_tiff(tmp_path / "c.tif")
    monkeypatch.setitem(sys.modules, "rasterio", None)  # as if hsgds[geo] were not installed
    with pytest.warns(HsgdsWarning, match="c.tif has a user-defined coordinate reference system"):
        describe_source(src)


def test_wavelengths_for_a_source_that_records_none(npy_scene, tmp_path, run_cli):
    from tests.envi import write_envi

    cp, lp, cube, _ = npy_scene(b=4)
    nm = tmp_path / "nm.txt"
    nm.write_text("# band centres, nm\n400.5\n410  # the second\n420, 430.25\n")
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "f.zarr", "--wavelengths", nm)
    assert code == 0, err
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "i.zarr", "--wavelengths", "400.5,410,420,430.25")
    assert code == 0, err
    for store in ("f.zarr", "i.zarr"):
        assert hsgds.open_scene(tmp_path / store).wavelengths == [400.5, 410.0, 420.0, 430.25]
    # a loader now selects bands by wavelength: the bands nearest 411 and 429 nm are 1 and 3
    with hsgds.PatchLoader(tmp_path / "f.zarr", patch_size=3, batch_size=16, wavelengths=[411, 429], shuffle=False,
                           device="cpu", normalize=None) as by_nm, \
            hsgds.PatchLoader(tmp_path / "f.zarr", patch_size=3, batch_size=16, bands=[1, 3], shuffle=False,
                              device="cpu", normalize=None) as by_index:
        assert all(np.array_equal(a[0], b[0]) for a, b in zip(by_nm, by_index))
    # a band without a centre (an unused detector band): none, or nan as numpy's savetxt writes it; stored as null
    nm.write_text("none\n410\nNaN  # unused\n430.25\n")
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "n.zarr", "--wavelengths", nm)
    assert code == 0 and "warning" not in err, err
    record = zarr.open_group(tmp_path / "n.zarr", mode="r").attrs["hsgds"]
    assert record["wavelengths"] == [None, 410.0, None, 430.25] and record["format_version"] == 4
    assert zarr.open_group(tmp_path / "f.zarr", mode="r").attrs["hsgds"]["format_version"] == 2
    envi_src = write_envi(tmp_path / "e.hdr", cube, wavelengths=[500.0, 510.0, 520.0, 530.0])
    for args, message in [
        ((cp, "--wavelengths", "400,410,420"), "--wavelengths lists 3 values but cube0.npy has 4 bands"),
        ((cp, "--wavelengths", "none,nan,None,NAN"), "--wavelengths gives no band a centre (none,none,none,none); "
                                                     "leave it out to record no wavelengths"),
        ((cp, "--wavelengths", "none,410,0.42,0.43"), "in nm (100-20000), got 0.42-410; give micrometres times 1000"),
        ((cp, "--wavelengths", "400,abc,420,430"), "'abc' is not a number"),
        # a mistyped file name was "'nmm.txt' is not a number"
        ((cp, "--wavelengths", tmp_path / "nmm.txt"), f"--wavelengths: there is no file {tmp_path / 'nmm.txt'}, and "
                                                      "it is not a number; check the path"),
        ((cp, "--wavelengths", "400,-410,420,430"), "--wavelengths must be positive finite numbers"),
        ((cp, "--wavelengths", "0.4,0.41,0.42,0.43"), "in nm (100-20000), got 0.4-0.43; give micrometres times 1000"),
        ((cp, "--wavelengths", ",".join(["400.0123456789"] * 40)), "lists 40 values but cube0.npy has 4"),  # > 255 chars
        ((envi_src, "--wavelengths", "400,410,420,430"), "records its own wavelengths (500-530 nm), which "
                                                          "--wavelengths contradicts"),
    ]:
        code, _, err = run_cli("convert", *args, "-o", tmp_path / "bad.zarr")
        assert code == 2 and message in err, (args, err)
        assert not (tmp_path / "bad.zarr").exists()


def test_labels_source_records_every_file_the_labels_were_read_from(tmp_path):
    """labels_source lists the files the labels were read from, with their total size and the sha256 of their
    bytes in that order (hashlib here): an ENVI header and its binary, whichever --labels names (data first,
    as source.files); a .npy alone. Read with zarr-python from the group's attributes."""
    import hashlib

    from hsgds.synthetic import make_scene
    from tests.envi import write_envi_labels

    cube, labels = make_scene(20, 16, 3, classes=3, seed=2)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    write_envi_labels(tmp_path / "gt.hdr", labels)
    for given, files in (("gt.hdr", ["gt.img", "gt.hdr"]), ("gt.img", ["gt.img", "gt.hdr"]), ("g.npy", ["g.npy"])):
        store = convert(tmp_path / "c.npy", tmp_path / f"{given}.zarr", ConvertOptions(labels=tmp_path / given))
        data = b"".join((tmp_path / f).read_bytes() for f in files)
        record = zarr.open_group(store, mode="r").attrs["hsgds"]["labels_source"]
        assert record == {"name": given, "files": files, "paths": files,
                          "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_batch_jobs_log_gets_tile_progress_lines_at_most_every_interval(npy_scene, tmp_path, run_cli, hsgds_env):
    """On a stderr that is not a terminal (captured here, as in a batch job's log) no bar is drawn, and a big
    scene's conversion said nothing for minutes: it now writes a line as tiles finish, at most every
    HSGDS_PROGRESS_LOG_S seconds, and one when the last finishes. At 0 a line per tile, counting up to the
    tiles of the chunk grid zarr-python reads; at a day only the last line."""
    import re

    line = re.compile(r"^hsgds: convert: (?P<done>[\d,]+) of (?P<total>[\d,]+) tiles done, "
                      r"(?:[\d,]+ tiles per s|[\d.]+ s per tile)(?P<left>, about \S+ left)?$")

    def progress_lines(stderr: str) -> list[tuple[int, int, bool]]:
        """(done, total, time left said) of each progress line."""
        return [(int(m["done"].replace(",", "")), int(m["total"].replace(",", "")), m["left"] is not None)
                for m in map(line.match, stderr.splitlines()) if m]

    cp, lp, _, _ = npy_scene(h=37, w=29, b=8, seed=6)  # 16x16x8 int16 tiles of 12 + 2 * 2: 4096 bytes
    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "a.zarr", "--max-patch", "5",
                           "--tile", "12")
    assert code == 0, err
    tiles = zarr.open_group(tmp_path / "a.zarr", mode="r")["tiles"].nchunks
    assert tiles == 4 * 3  # ceil(37 / 12) x ceil(29 / 12)
    assert progress_lines(err) == [(k, tiles, k < tiles) for k in range(1, tiles + 1)], err

    hsgds_env("HSGDS_PROGRESS_LOG_S", "86400")  # the conversion takes less than a day: the last line alone
    code, _, err = run_cli("convert", cp, "--labels", lp, "-o", tmp_path / "b.zarr", "--max-patch", "5",
                           "--tile", "12")
    assert code == 0, err
    assert progress_lines(err) == [(tiles, tiles, False)], err


def test_a_conversion_failing_after_its_last_tile_logs_no_line_saying_all_tiles_done(npy_scene, tmp_path, run_cli,
                                                                                      hsgds_env):
    """In a log, a conversion that fails once every tile is written (here: band statistics that overflow float64,
    found after the tiles) wrote "12 of 12 tiles done" before its error, which read as success: the lines stop
    at the tiles before the last, the error follows, and nothing is left; a conversion that succeeds still ends
    with the line of all its tiles."""
    import re

    line = re.compile(r"^hsgds: convert: (?P<done>[\d,]+) of (?P<total>[\d,]+) tiles done, ")
    _, lp, cube, _ = npy_scene(h=37, w=29, b=4, seed=6)  # (float64: 16x16x4 tiles of 8192 bytes)
    np.save(tmp_path / "big.npy", cube.astype(np.float64) * 1e160)
    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    before = set(tmp_path.iterdir())
    code, _, err = run_cli("convert", tmp_path / "big.npy", "--labels", lp, "-o", tmp_path / "o.zarr",
                           "--max-patch", "5", "--tile", "12")
    assert code == 2 and set(tmp_path.iterdir()) == before, err
    tiles = 4 * 3  # ceil(37 / 12) x ceil(29 / 12)
    done = [(int(m["done"]), int(m["total"])) for m in map(line.match, err.splitlines()) if m]
    assert done == [(k, tiles) for k in range(1, tiles)], err  # every tile but the last said, as before
    assert err.splitlines()[-1].startswith("hsgds: error: band 0: the std of the scene's pixels is inf"), err

    np.save(tmp_path / "fine.npy", cube.astype(np.float64))
    code, _, err = run_cli("convert", tmp_path / "fine.npy", "--labels", lp, "-o", tmp_path / "o.zarr",
                           "--max-patch", "5", "--tile", "12")
    assert code == 0 and [m[0] for m in map(line.match, err.splitlines()) if m][-1] == \
        f"hsgds: convert: {tiles} of {tiles} tiles done, ", err


def test_paths_with_a_newline_or_thousands_of_characters_are_shown_on_one_short_line(tmp_path, run_cli):
    """A --labels or -o path holding a newline made a two-line error, one of 3,000 characters a 3,000-character
    one: each is shown escaped and clipped in the middle, its file name kept; nothing is written."""
    import re

    np.save(tmp_path / "c.npy", np.ones((8, 8, 3), np.int16))
    long_folder = "/x/" + "d" * 3000
    for args, want in [
        (("--labels", tmp_path / "no\nsuch.npy", "-o", tmp_path / "s.zarr"),
         re.escape(f"cannot read {tmp_path}/no\\nsuch.npy (No such file or directory); check the path")),
        (("--labels", f"{long_folder}/gt.npy", "-o", tmp_path / "s.zarr"), r"cannot read /x/d+\.\.\.gt\.npy \(No such"),
        (("-o", tmp_path / "bad\ndir" / "s.zarr"),
         re.escape(f"output folder {tmp_path}/bad\\ndir does not exist; create it first")),
    ]:
        code, _, err = run_cli("convert", tmp_path / "c.npy", *args)
        assert code == 2 and err.count("\n") == 1 and len(err) < 600, err
        assert re.search(want, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]
