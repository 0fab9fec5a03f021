"""Source nodata (format v3): a pixel whose every band equals the source's nodata value is left out of the band
statistics, the labels and the samples, and its bands are filled with the normalization mean in the tiles.
Sources are written independently (rasterio for GeoTIFF, SPy for ENVI, numpy); expected tiles, statistics and
counts are computed with numpy alone."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr

import hsgds
from hsgds.preprocess.convert import ConvertOptions, NodataWarning, convert

from .test_convert import reference_tiles

rasterio = pytest.importorskip("rasterio")
envi = pytest.importorskip("spectral.io.envi")


def swath(h, w, b, dtype, nodata, seed=0):
    """A cube of random data inside a slanted swath and ``nodata`` in every band outside it (as a rotated
    flight line looks), and the (H, W) nodata mask."""
    rng = np.random.default_rng(seed)
    cube = rng.integers(50, 900, (h, w, b)).astype(dtype)
    y, x = np.mgrid[:h, :w]
    gaps = (x < y // 3 + 2) | (x > y // 3 + w // 2)
    cube[gaps] = nodata
    return cube, gaps


def write_tif(path, cube, nodata):
    """A georeferenced GeoTIFF with a nodata value, written by rasterio (GDAL)."""
    from rasterio.transform import Affine

    h, w, b = cube.shape
    with rasterio.open(path, "w", driver="GTiff", height=h, width=w, count=b, dtype=cube.dtype, nodata=nodata,
                       crs="EPSG:32616", transform=Affine(30.0, 0.0, 600000.0, 0.0, -30.0, 4000000.0)) as dst:
        dst.write(cube.transpose(2, 0, 1))
    return path


def expected_fill(cube, gaps, train_mask):
    """The fill as numpy computes it: the mean of the train pixels with data (every data pixel when there are
    no train pixels), rounded to the cube's dtype."""
    pixels = cube[train_mask & ~gaps] if train_mask is not None and (train_mask & ~gaps).any() else cube[~gaps]
    mean = pixels.astype(np.float64).mean(axis=0)
    if cube.dtype.kind == "f":
        return mean.astype(cube.dtype)
    return np.rint(mean).astype(cube.dtype)


def train_mask_of(scene):
    t = scene.sample_table()
    g = scene.grid
    ty, tx = np.divmod(t["tile"].astype(np.int64), g.ntx)
    mask = np.zeros(scene.shape[:2], bool)
    train = t["split"] == 1
    mask[(ty * g.tile + t["y"])[train], (tx * g.tile + t["x"])[train]] = True
    return mask


def check_store(store, cube, gaps, padding, halo, labels=None):
    """Everything the store says about nodata, against numpy."""
    scene = hsgds.open_scene(store)
    assert scene.meta.format_version == 3  # the oldest with a nodata record (no band without a centre)
    record = scene.meta.nodata
    assert record["pixels"] == int(gaps.sum())
    np.testing.assert_array_equal(scene.nodata_every(1), gaps)
    np.testing.assert_array_equal(scene.nodata_every(3), gaps[::3, ::3])
    train = train_mask_of(scene) if labels is not None else None
    if labels is not None:
        assert record["labelled_dropped"] == int(np.count_nonzero(labels[gaps]))
        np.testing.assert_array_equal(scene.labels, np.where(gaps, 0, labels))
        assert not (train & gaps).any()
    assert record["fill"] == ("train mean" if train is not None and train.any() else "scene mean")
    # statistics of the data pixels only
    data = cube[~gaps].astype(np.float64)
    np.testing.assert_allclose(scene.stats["all"].mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(scene.stats["all"].std, data.std(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(scene.stats["all"].min, data.min(axis=0))
    np.testing.assert_array_equal(scene.stats["all"].max, data.max(axis=0))
    # tiles (zarr-python reads them) = numpy's padding of the cube with its nodata pixels filled
    filled = cube.copy()
    filled[gaps] = expected_fill(cube, gaps, train)
    g = zarr.open_group(store, mode="r")
    np.testing.assert_array_equal(g["tiles"][...], reference_tiles(filled, scene.grid.tile, halo, padding))
    assert scene.verify() == []  # checksums of the filled tiles
    # a window read gives the source back, its nodata value included (the fill is the tiles' own business)
    h, w, _ = cube.shape
    np.testing.assert_array_equal(scene.read(0, h, 0, w), cube)
    np.testing.assert_array_equal(scene.read(h // 3, h // 2 + 1, 1, w - 2), cube[h // 3:h // 2 + 1, 1:w - 2])
    return scene


@pytest.mark.parametrize("dtype,padding", [("int16", "reflect"), ("float32", "edge"), ("uint16", "zero")])
def test_geotiff_nodata_from_rasterio(tmp_path, dtype, padding):
    nodata = 0 if dtype == "uint16" else -9999
    cube, gaps = swath(41, 37, 4, dtype, nodata, seed=1)
    store = convert(write_tif(tmp_path / "c.tif", cube, nodata), tmp_path / "s.zarr", ConvertOptions(padding=padding, max_patch=7))
    scene = check_store(store, cube, gaps, padding, 3)
    assert scene.meta.nodata["value"] == nodata and scene.meta.nodata["labelled_dropped"] == 0


def test_xarray_view_names_the_nodata_value(tmp_path):
    pytest.importorskip("xarray")
    cube, gaps = swath(21, 19, 3, "float32", -9999, seed=13)
    store = convert(write_tif(tmp_path / "c.tif", cube, -9999), tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    da = hsgds.open_scene(store).to_xarray()
    assert da.attrs["_FillValue"] == np.float32(-9999) and da.attrs["_FillValue"].dtype == np.float32
    np.testing.assert_array_equal(da.values, cube)
    assert int((da == da.attrs["_FillValue"]).all("band").sum()) == int(gaps.sum())


def test_zero_padding_is_not_nodata_zero(tmp_path):
    """With nodata 0 and zero padding, the padding's zeros are padding, not pixels to fill."""
    cube, gaps = swath(20, 24, 3, "uint16", 0, seed=2)
    np.save(tmp_path / "c.npy", cube)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(padding="zero", max_patch=5, nodata=0))
    tiles = zarr.open_group(store, mode="r")["tiles"][...]
    assert (tiles[0, 0, :2] == 0).all() and (tiles[0, 0, :, :2] == 0).all()  # the top and left halo stay zero
    check_store(store, cube, gaps, "zero", 2)


def test_envi_data_ignore_value_from_spy_with_labels(tmp_path):
    cube, gaps = swath(45, 33, 5, "int16", -9999, seed=3)
    envi.save_image(str(tmp_path / "e.hdr"), cube, metadata={"data ignore value": -9999}, interleave="bil",
                    ext=".img")
    labels = np.random.default_rng(4).integers(0, 4, cube.shape[:2]).astype(np.uint8)
    np.save(tmp_path / "gt.npy", labels)
    with pytest.warns(NodataWarning, match=rf"{np.count_nonzero(labels[gaps])} labelled pixels of gt.npy are nodata"):
        store = convert(tmp_path / "e.hdr", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.npy",
                                                                                train=0.3, max_patch=5))
    scene = check_store(store, cube, gaps, "reflect", 2, labels)
    assert scene.meta.num_samples == int(np.count_nonzero(labels[~gaps]))
    assert scene.meta.num_classes == int(labels.max())


def test_nan_nodata_and_nan_fill(tmp_path):
    cube, gaps = swath(30, 30, 4, "float32", np.nan, seed=5)
    np.save(tmp_path / "c.npy", cube)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(nodata=float("nan"), max_patch=5))
    assert hsgds.open_scene(store).meta.nodata["value"] == "nan"
    check_store(store, cube, gaps, "reflect", 2)
    # a pixel with some bands NaN has data: it is refused, or filled by --nan-fill, as before
    cube[20, 15, 1] = np.nan
    np.save(tmp_path / "c.npy", cube)
    with pytest.raises(hsgds.InputError, match=r"NaN/Inf values in pixels with data .*only a pixel NaN in every band is "
                                               r"nodata\); pass --nan-fill VALUE"):
        convert(tmp_path / "c.npy", tmp_path / "t.zarr", ConvertOptions(nodata=float("nan"), max_patch=5))
    convert(tmp_path / "c.npy", tmp_path / "t.zarr", ConvertOptions(nodata=float("nan"), nan_fill=0.0, max_patch=5))
    # without a nodata value, the message says which option fits a swath of NaN
    with pytest.raises(hsgds.InputError, match=r"pass --nan-fill VALUE to replace them, or --nodata nan if pixels NaN "
                                               "in every band have no data"):
        convert(tmp_path / "c.npy", tmp_path / "u.zarr", ConvertOptions(max_patch=5))
    assert hsgds.open_scene(tmp_path / "t.zarr").read(20, 21, 15, 16)[0, 0, 1] == 0


def test_nodata_none_ignores_the_source_value_and_a_value_overrides_it(tmp_path):
    cube, gaps = swath(20, 20, 3, "int16", -9999, seed=6)
    write_tif(tmp_path / "c.tif", cube, -9999)
    store = convert(tmp_path / "c.tif", tmp_path / "a.zarr", ConvertOptions(nodata="none", max_patch=3))
    scene = hsgds.open_scene(store)
    assert scene.meta.nodata is None and scene.nodata_every(1) is None
    np.testing.assert_array_equal(scene.read(0, 20, 0, 20), cube)  # every pixel as it was
    assert scene.stats["all"].min.min() == -9999
    # another value: no pixel has every band equal to it, so nothing is filled
    store = convert(tmp_path / "c.tif", tmp_path / "b.zarr", ConvertOptions(nodata=123, max_patch=3))
    record = hsgds.open_scene(store).meta.nodata
    assert record == {"value": 123.0, "pixels": 0, "labelled_dropped": 0, "fill": None}
    assert not (store / "nodata").exists()


def test_a_value_the_dtype_cannot_hold_marks_no_pixel(tmp_path):
    cube = np.random.default_rng(7).integers(0, 100, (12, 12, 3)).astype(np.uint16)
    np.save(tmp_path / "c.npy", cube)
    for value in (-9999, 2.5, float("nan")):
        store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(nodata=value, max_patch=3,
                                                                                overwrite=True))
        assert hsgds.open_scene(store).meta.nodata["pixels"] == 0


def test_every_pixel_nodata_is_refused(tmp_path):
    np.save(tmp_path / "c.npy", np.full((10, 10, 2), -1, np.int16))
    with pytest.raises(hsgds.InputError, match=r"every pixel of c.npy is nodata \(all bands -1\)"):
        convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(nodata=-1, max_patch=3))
    assert not (tmp_path / "s.zarr").exists()


def test_a_pixel_with_some_bands_at_the_value_has_data(tmp_path):
    cube = np.random.default_rng(8).integers(1, 100, (10, 10, 3)).astype(np.int16)
    cube[2, 3, 0] = -9999  # one band only: data (a dark band, a saturated detector), not a gap
    cube[5, 5] = -9999
    np.save(tmp_path / "c.npy", cube)
    scene = hsgds.open_scene(convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(nodata=-9999,
                                                                                             max_patch=3)))
    expected = np.zeros((10, 10), bool)
    expected[5, 5] = True
    np.testing.assert_array_equal(scene.nodata_every(1), expected)
    assert scene.read(2, 3, 3, 4)[0, 0, 0] == -9999


@pytest.mark.parametrize("text", ["abc", "1e999"])
def test_bad_recorded_nodata_is_one_line(tmp_path, text):
    envi.save_image(str(tmp_path / "e.hdr"), np.zeros((4, 5, 2), np.int16), metadata={"data ignore value": text},
                    ext=".img")
    with pytest.raises(hsgds.InputError, match="nodata value .* fix or remove 'data ignore value'"):
        convert(tmp_path / "e.hdr", tmp_path / "s.zarr", ConvertOptions())


@pytest.mark.parametrize("fmt_", ["envi", "tiff"])
def test_bad_recorded_nodata_can_be_overridden(tmp_path, fmt_):
    """A nodata value the file records but that is no number stops the conversion only when it would be used:
    --nodata VALUE or --nodata none converts the file as it is (a read-only archive need not be rewritten)."""
    cube = np.zeros((4, 5, 2), np.int16)
    cube[0, 0] = -9999
    if fmt_ == "envi":
        envi.save_image(str(tmp_path / "e.hdr"), cube, metadata={"data ignore value": "abc"}, ext=".img")
        src, fix = tmp_path / "e.hdr", "fix or remove 'data ignore value'"
    else:
        tifffile = pytest.importorskip("tifffile")
        tifffile.imwrite(tmp_path / "e.tif", cube, planarconfig="contig", extratags=[(42113, "s", 0, "abc", True)])
        src, fix = tmp_path / "e.tif", r"fix the GDAL_NODATA tag \(gdal_edit.py -a_nodata VALUE, or -unsetnodata\)"
    with pytest.raises(hsgds.InputError, match=rf"nodata value 'abc' is not a number; {fix}, or override it with "
                                               r"--nodata VALUE \(or --nodata none\)$"):
        convert(src, tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    assert hsgds.open_scene(convert(src, tmp_path / "n.zarr", ConvertOptions(max_patch=3, nodata="none"))).meta.nodata is None
    record = hsgds.open_scene(convert(src, tmp_path / "v.zarr", ConvertOptions(max_patch=3, nodata=-9999))).meta.nodata
    assert record["value"] == -9999 and record["pixels"] == 1


def test_manifest_nodata_column(tmp_path):
    """A manifest row's nodata value is that scene's; an empty cell takes --nodata; a bad one names its line."""
    from hsgds.preprocess.convert_many import read_manifest

    for name in ("a", "b", "c"):
        np.save(tmp_path / f"{name}.npy", np.zeros((4, 4, 2), np.int16))
    (tmp_path / "m.csv").write_text("source,nodata\na.npy,-9999\nb.npy,\nc.npy,none\n")
    rows = read_manifest(tmp_path / "m.csv")
    assert [r.nodata for r in rows] == [-9999.0, None, "none"]
    given = ConvertOptions(nodata=0.0)
    assert [r.options(given).nodata for r in rows] == [-9999.0, 0.0, "none"]
    (tmp_path / "m.csv").write_text("source,nodata\na.npy,-9999\nb.npy,minus one\n")
    with pytest.raises(hsgds.InputError, match=r"line 3: nodata: 'minus one' is not a number, nan or none"):
        read_manifest(tmp_path / "m.csv")


def test_cli_counts_one_nodata_pixel_in_the_singular(tmp_path, run_cli):
    cube = np.ones((3, 2, 4), np.int16)
    cube[0, 0] = -9999
    np.save(tmp_path / "c.npy", cube)
    code, out, err = run_cli("convert", tmp_path / "c.npy", "-o", tmp_path / "s.zarr", "--nodata", "-9999",
                             "--max-patch", "3")
    assert code == 0, err
    assert "nodata: 1 pixel (every band -9999), left out of samples" in out


def test_bad_nodata_option():
    """ConvertOptions takes a float or "none" (the CLI parses its text with nodata_option): a string, even "nan",
    is refused with a message that says how to give NaN."""
    expected = r"^nodata must be a number \(float\('nan'\) for NaN, not infinite\) or 'none', got "
    with pytest.raises(hsgds.ConfigError, match=expected + "inf$"):
        ConvertOptions(nodata=float("inf")).check()
    for text in ("missing", "nan"):
        with pytest.raises(hsgds.ConfigError, match=expected + f"'{text}'$"):
            ConvertOptions(nodata=text).check()


def test_numpy_nodata_values_are_checked_like_floats(tmp_path):
    """A nodata value from numpy (np.float32, as a raster's metadata may hold it, is no float) is checked like a
    float: an infinity, a bool or a non-number is a one-line ConfigError before any file is written (an infinite
    value used to be written into a store that then refused to open); a finite numpy value works as its float."""
    cube, gaps = swath(20, 20, 3, "float32", -9999, seed=21)
    np.save(tmp_path / "c.npy", cube)
    for bad in (np.float32("inf"), np.float64("-inf"), True, np.bool_(False), [-9999]):
        with pytest.raises(hsgds.ConfigError, match=r"^nodata must be a number .* or 'none', got "):
            convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(nodata=bad, max_patch=3))
        assert not (tmp_path / "s.zarr").exists()
    for value in (np.float32(-9999), np.int16(-9999)):
        scene = hsgds.open_scene(convert(tmp_path / "c.npy", tmp_path / "s.zarr",
                                         ConvertOptions(nodata=value, max_patch=3, overwrite=True)))
        assert scene.meta.nodata["value"] == -9999 and scene.meta.nodata["pixels"] == int(gaps.sum())
        np.testing.assert_array_equal(scene.nodata_every(), (cube == -9999).all(axis=-1))


def test_cli_reports_nodata_and_refuses_a_bad_value(tmp_path, run_cli):
    cube, gaps = swath(20, 20, 3, "int16", -9999, seed=9)
    np.save(tmp_path / "c.npy", cube)
    code, out, _ = run_cli("convert", tmp_path / "c.npy", "-o", tmp_path / "s.zarr", "--nodata", "-9999",
                           "--max-patch", "3")
    assert code == 0
    assert f"nodata: {int(gaps.sum())} pixels (every band -9999), left out of samples" in out
    code, out, _ = run_cli("verify", tmp_path / "s.zarr")
    assert code == 0 and out.startswith("ok: 1 tile, ") and "(crc32c and wsum64, the nodata map)" in out
    code, _, err = run_cli("convert", tmp_path / "c.npy", "-o", tmp_path / "t.zarr", "--nodata", "x")
    assert code == 2 and err.strip() == "hsgds: error: --nodata: 'x' is not a number, nan or none"
    assert not (tmp_path / "t.zarr").exists()
    # a value no pixel holds in every band (here one the dtype cannot hold): said, not silent
    np.save(tmp_path / "u.npy", np.ones((8, 8, 2), np.uint8))
    code, out, _ = run_cli("convert", tmp_path / "u.npy", "-o", tmp_path / "u.zarr", "--nodata", "-9999",
                           "--max-patch", "3")
    assert code == 0 and "nodata: no pixel has every band at -9999; every pixel is data" in out


def test_a_float_nodata_the_dtype_cannot_hold_marks_no_pixel(tmp_path):
    """-1e39 on a float32 cube (GDAL's rule, as for integers: a value the dtype cannot hold marks no pixel):
    converted without a cast overflowing to -inf, every pixel data, the cube read back as it was."""
    cube = np.random.default_rng(3).random((12, 12, 3)).astype(np.float32)
    np.save(tmp_path / "c.npy", cube)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "overflow encountered in cast"
        scene = hsgds.open_scene(convert(tmp_path / "c.npy", tmp_path / "s.zarr",
                                         ConvertOptions(nodata=-1e39, max_patch=3)))
    assert scene.nodata_every() is None or not scene.nodata_every().any()
    np.testing.assert_array_equal(scene.read(0, 12, 0, 12), cube)


def test_convert_many_converts_again_when_nodata_changes(tmp_path):
    from hsgds.preprocess.convert_many import _options_differ, _source_nodata_differs

    cube, _ = swath(20, 20, 3, "int16", -9999, seed=10)
    write_tif(tmp_path / "c.tif", cube, -9999)
    store = convert(tmp_path / "c.tif", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    meta = hsgds.open_scene(store).meta
    assert _options_differ(meta, ConvertOptions(max_patch=3)) is None  # the source's own value, as converted
    assert _options_differ(meta, ConvertOptions(max_patch=3, nodata=-9999.0)) is None
    assert _options_differ(meta, ConvertOptions(max_patch=3, nodata="none")) == \
        "--nodata none differs from the store's (-9999)"
    assert _options_differ(meta, ConvertOptions(max_patch=3, nodata=0.0)) == \
        "--nodata 0 differs from the store's (-9999)"
    assert _source_nodata_differs(meta, ConvertOptions(max_patch=3), tmp_path / "c.tif") is None
    # a store of format v2 ignored the value its GeoTIFF records (an hsgds before v3 wrote it, or this one with
    # --nodata none: nothing in the store tells which): converted again
    meta.format_version, meta.nodata = 2, None
    assert _source_nodata_differs(meta, ConvertOptions(max_patch=3), tmp_path / "c.tif") == \
        "the source's nodata value (-9999) differs from the store's (none); no --nodata is given"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.save(tmp_path / "c.npy", cube)  # a source that records none: nothing to say
        assert _source_nodata_differs(meta, ConvertOptions(max_patch=3), tmp_path / "c.npy") is None


def test_convert_many_names_the_manifests_nodata_column(tmp_path):
    """A nodata value from the manifest's column is named as the column, not as --nodata (which the user may not
    have passed), and shown as written (-9998, not -9998.0)."""
    from hsgds.preprocess.convert_many import _options_differ, read_manifest

    cube, _ = swath(20, 20, 3, "int16", -9999, seed=10)
    np.save(tmp_path / "c.npy", cube)
    meta = hsgds.open_scene(convert(tmp_path / "c.npy", tmp_path / "n.zarr",
                                    ConvertOptions(max_patch=3, nodata=-9999.0))).meta
    (tmp_path / "m.csv").write_text("source,nodata\nc.npy,-9998\n")
    opts = read_manifest(tmp_path / "m.csv")[0].options(ConvertOptions(max_patch=3))
    assert _options_differ(meta, opts) == (f"the nodata column of manifest {tmp_path / 'm.csv'} line 2 -9998 differs "
                                           "from the store's (-9999)")
    assert _options_differ(meta, ConvertOptions(max_patch=3, nodata="none")) == "--nodata none differs from the store's (-9999)"


def test_a_z_scored_patch_reads_0_at_nodata_pixels(tmp_path):
    """End to end: where a patch centred on a data pixel reaches over the swath's edge it reads the fill, the train
    mean, which z-scores to 0 (within the rounding of an integer cube); its data pixels read their own values."""
    torch = pytest.importorskip("torch")
    cube, gaps = swath(40, 36, 4, "int16", -9999, seed=11)
    labels = np.where(gaps, 0, np.random.default_rng(12).integers(1, 4, gaps.shape)).astype(np.uint8)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.npy", nodata=-9999,
                                                                            train=0.5, max_patch=5))
    stats = hsgds.open_scene(store).norm_stats
    p, r = 5, 2
    seen = 0
    with hsgds.PatchLoader(store, patch_size=p, batch_size=64, split=None, device="cpu", return_coords=True,
                           layout="NHWC", dtype=torch.float32) as loader:
        for patches, _, coords in loader:
            for patch, (y, x) in zip(patches.numpy(), coords.numpy()):
                ys, xs = np.arange(y - r, y + r + 1), np.arange(x - r, x + r + 1)
                inside = (ys[:, None] >= 0) & (ys[:, None] < 40) & (xs[None, :] >= 0) & (xs[None, :] < 36)
                at = gaps[np.clip(ys, 0, 39)][:, np.clip(xs, 0, 35)] & inside
                assert not gaps[y, x]
                if at.any():
                    seen += 1
                    assert np.all(np.abs(patch[at]) <= 0.5 / stats.std + 1e-6)
                data = inside & ~at
                expected = (cube[np.clip(ys, 0, 39)][:, np.clip(xs, 0, 35)] - stats.mean) / stats.std
                np.testing.assert_allclose(patch[data], expected[data], rtol=1e-5, atol=1e-5)
    assert seen > 50


def test_a_split_whose_train_pixels_are_all_nodata_is_refused(tmp_path):
    """Labelled nodata pixels are found while tiling and the labels that remain are split again: when that split
    has no train pixel the conversion is refused (its statistics would be the scene's, and there is nothing to
    train on), saying that the nodata pixels were left out."""
    cube = np.random.default_rng(14).integers(1, 100, (20, 20, 3)).astype(np.int16)
    cube[:10] = -9999
    labels = np.zeros((20, 20), np.uint8)
    labels[:10, :10], labels[15, 15] = 1, 2
    train, test = np.zeros((20, 20), bool), np.zeros((20, 20), bool)
    train[:10, :10], test[15, 15] = True, True
    for name, a in (("c", cube), ("gt", labels), ("tm", train), ("te", test)):
        np.save(tmp_path / f"{name}.npy", a)
    options = ConvertOptions(labels=tmp_path / "gt.npy", nodata=-9999, split="masks", train_mask=tmp_path / "tm.npy",
                             test_mask=tmp_path / "te.npy", max_patch=3)
    with pytest.raises(hsgds.InputError, match=r"^without the \d+ labelled pixels that are nodata in c.npy \(all bands "
                                               r"-9999\): --train-mask covers none of the labelled pixels"):
        convert(tmp_path / "c.npy", tmp_path / "s.zarr", options)
    assert not (tmp_path / "s.zarr").exists()


def test_convert_many_converts_again_when_a_given_nodata_is_no_longer_given(tmp_path):
    """A store converted with a manifest's nodata value is converted again once the row gives none: the source's
    own applies then (none for a .npy, the GeoTIFF's GDAL_NODATA), as in a fresh conversion; it was kept with
    the old value."""
    from hsgds.preprocess.convert_many import convert_scene, read_manifest

    cube, gaps = swath(20, 20, 3, "int16", -9999, seed=15)
    np.save(tmp_path / "a.npy", cube)
    write_tif(tmp_path / "b.tif", cube, -9999)
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)

    def run(manifest):
        (tmp_path / "m.csv").write_text(manifest)
        return [convert_scene(row, out, opts) for row in read_manifest(tmp_path / "m.csv")]

    assert [r.status for r in run("source,nodata\na.npy,-9999\nb.tif,none\n")] == ["converted"] * 2
    assert [r.status for r in run("source,nodata\na.npy,-9999\nb.tif,none\n")] == ["up to date"] * 2
    again = run("source\na.npy\nb.tif\n")
    assert [(r.status, r.reason) for r in again] == [
        ("converted", "the source's nodata value (none) differs from the store's (-9999); no --nodata is given"),
        ("converted", "the source's nodata value (-9999) differs from the store's (none); no --nodata is given")]
    assert hsgds.open_scene(out / "a.zarr").meta.nodata is None
    assert hsgds.open_scene(out / "b.zarr").meta.nodata["pixels"] == int(gaps.sum())
    assert [r.status for r in run("source\na.npy\nb.tif\n")] == ["up to date"] * 2


def test_hdf5_fill_value_as_netcdf_products_declare_it(tmp_path):
    """An EMIT-like netCDF-4/HDF5 product: reflectance (downtrack, crosstrack, bands) float32 whose _FillValue
    attribute (-9999, a one-element array, as netCDF writes it) marks the pixels outside the swath."""
    import h5py

    cube, gaps = swath(26, 22, 5, "float32", -9999, seed=14)
    with h5py.File(tmp_path / "emit.nc", "w") as f:
        d = f.create_dataset("reflectance", data=cube)
        d.attrs["_FillValue"] = np.array([-9999.0], np.float32)
        f.create_dataset("elev", data=np.zeros((26, 22), np.float32))  # a 2-D variable beside it, as in EMIT
    store = convert(tmp_path / "emit.nc", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    scene = check_store(store, cube, gaps, "reflect", 1)
    assert scene.meta.nodata["value"] == -9999
    # missing_value is read when _FillValue is absent; several missing values name no single one
    for attr, value, pixels in (("missing_value", np.float32(-9999), int(gaps.sum())),
                                ("missing_value", np.array([-9999.0, -1.0], np.float32), None)):
        with h5py.File(tmp_path / "m.h5", "w") as f:
            f.create_dataset("cube", data=cube).attrs[attr] = value
        store = convert(tmp_path / "m.h5", tmp_path / "m.zarr", ConvertOptions(max_patch=3, overwrite=True))
        record = hsgds.open_scene(store).meta.nodata
        assert (record["pixels"] if record else None) == pixels
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f.create_dataset("cube", data=cube).attrs["_FillValue"] = np.array([1.0, 2.0], np.float32)
    with pytest.raises(hsgds.InputError, match=r"dataset 'cube' in bad.h5: attribute _FillValue holds 2 values, not "
                                               r"one; fix it, or override it with --nodata VALUE \(or --nodata none\)"):
        convert(tmp_path / "bad.h5", tmp_path / "b.zarr", ConvertOptions(max_patch=3))
    store = convert(tmp_path / "bad.h5", tmp_path / "b.zarr", ConvertOptions(max_patch=3, nodata=-9999.0))
    assert hsgds.open_scene(store).meta.nodata["pixels"] == int(gaps.sum())
    # convert-many without the --nodata that overrode it: converted again (which refuses it), not kept
    from hsgds.preprocess.convert_many import _source_nodata_differs

    reason = _source_nodata_differs(hsgds.open_scene(store).meta, ConvertOptions(max_patch=3), tmp_path / "bad.h5")
    assert reason is not None and reason.startswith("the source's own nodata value cannot be used (") and \
        "_FillValue holds 2 values" in reason, reason


@pytest.mark.parametrize("split", [dict(split="random", train=0.2, val=0.1), dict(split="blocks", train=0.2, block_size=8)])
def test_labels_reaching_over_nodata_are_split_as_if_given_without_them(tmp_path, split):
    """Ground truth drawn past the swath: the store is the one converted from the same labels with the nodata
    pixels cleared by the user (split, samples, statistics, tiles, bit for bit), so train shares and the
    per-class minimums hold; only the record counts the dropped pixels, and a NodataWarning says so."""
    cube, gaps = swath(48, 40, 4, "int16", -9999, seed=15)
    labels = np.random.default_rng(16).integers(0, 5, gaps.shape).astype(np.uint8)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "over.npy", labels)
    np.save(tmp_path / "inside.npy", np.where(gaps, 0, labels).astype(np.uint8))
    options = dict(nodata=-9999, max_patch=5, seed=3, **split)
    with pytest.warns(NodataWarning, match=f"{np.count_nonzero(labels[gaps])} labelled pixels of over.npy"):
        over = convert(tmp_path / "c.npy", tmp_path / "over.zarr", ConvertOptions(labels=tmp_path / "over.npy",
                                                                                   **options))
    inside = convert(tmp_path / "c.npy", tmp_path / "inside.zarr", ConvertOptions(labels=tmp_path / "inside.npy",
                                                                                  **options))
    a, b = hsgds.open_scene(over), hsgds.open_scene(inside)
    assert a.meta.nodata["labelled_dropped"] == np.count_nonzero(labels[gaps]) and b.meta.nodata["labelled_dropped"] == 0
    assert a.meta.split == b.meta.split and a.meta.num_samples == b.meta.num_samples
    np.testing.assert_array_equal(a.labels, b.labels)
    for name, values in b.sample_table().items():
        np.testing.assert_array_equal(a.sample_table()[name], values, err_msg=name)
    for group in ("train", "all"):
        for field in ("mean", "std", "min", "max"):
            np.testing.assert_array_equal(getattr(a.stats[group], field), getattr(b.stats[group], field))
    assert a.meta.checksums == b.meta.checksums and a.meta.device_checksums == b.meta.device_checksums


def test_every_labelled_pixel_nodata_is_refused(tmp_path):
    cube, gaps = swath(20, 20, 3, "int16", -9999, seed=17)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "gt.npy", np.where(gaps, 1, 0).astype(np.uint8))
    with pytest.raises(hsgds.InputError, match="every labelled pixel of gt.npy is nodata in c.npy .*alignment"):
        convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.npy", nodata=-9999,
                                                                        max_patch=3))
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("fmt", ["tif", "envi", "tif-nan", "netcdf"])
def test_a_label_raster_s_own_nodata_reads_as_unlabelled(tmp_path, fmt):
    """A classification raster from a GIS marks pixels without a class by its nodata value (255 here, NaN in a
    float raster): they are unlabelled (0), not class 255, so the classes and the split are those of the rest."""
    rng = np.random.default_rng(18)
    cube = rng.integers(0, 500, (30, 24, 3)).astype(np.int16)
    np.save(tmp_path / "c.npy", cube)
    classes = rng.integers(1, 4, (30, 24))
    outside = np.zeros((30, 24), bool)
    outside[:, :6] = True
    if fmt == "tif-nan":
        raster, value, dtype = np.where(outside, np.nan, classes).astype(np.float32), float("nan"), "float32"
    else:
        raster, value, dtype = np.where(outside, 255, classes).astype(np.uint8), 255, "uint8"
    if fmt.startswith("tif"):
        from rasterio.transform import Affine

        path = tmp_path / "gt.tif"
        with rasterio.open(path, "w", driver="GTiff", height=30, width=24, count=1, dtype=dtype, nodata=value,
                           crs="EPSG:32616", transform=Affine(30.0, 0.0, 600000.0, 0.0, -30.0, 4000000.0)) as dst:
            dst.write(raster, 1)
    elif fmt == "netcdf":  # a classification variable with _FillValue, as netCDF-4 writes it (h5py here)
        import h5py

        path = tmp_path / "gt.nc"
        with h5py.File(path, "w") as f:
            f.create_dataset("classes", data=raster).attrs["_FillValue"] = np.array([value], np.uint8)
    else:
        path = tmp_path / "gt.hdr"
        envi.save_image(str(path), raster[:, :, None], metadata={"data ignore value": value}, ext=".img")
    scene = hsgds.open_scene(convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=path,
                                                                                         max_patch=3)))
    np.testing.assert_array_equal(scene.labels, np.where(outside, 0, classes))
    assert scene.num_classes == 3 and scene.meta.num_samples == int((~outside).sum())


def test_a_label_file_s_unreadable_fill_value_is_one_line(tmp_path):
    """Several _FillValue values on a label variable: a one-line InputError that says to fix it (not to pass
    --nodata, which is the cube's)."""
    import h5py

    np.save(tmp_path / "c.npy", np.ones((6, 5, 2), np.int16))
    with h5py.File(tmp_path / "gt.h5", "w") as f:
        f.create_dataset("classes", data=np.ones((6, 5), np.uint8)).attrs["_FillValue"] = np.array([0, 255], np.uint8)
    with pytest.raises(hsgds.InputError, match=r"^dataset 'classes' in gt.h5: attribute _FillValue holds 2 values, "
                                               r"not one; fix it$"):
        convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.h5", max_patch=3))


def test_nan_inside_a_minus_9999_swath_does_not_suggest_nodata_nan(tmp_path):
    """A GeoTIFF whose nodata is -9999 with a NaN pixel inside the swath: the error asks for --nan-fill only;
    --nodata nan would replace -9999 as the nodata value, making the swath's edge data (its -9999 in the
    statistics)."""
    cube, _ = swath(20, 20, 3, "float32", -9999, seed=22)
    cube[10, 10, 1] = np.nan
    write_tif(tmp_path / "c.tif", cube, -9999)
    with pytest.raises(hsgds.InputError, match=r"^the cube holds NaN/Inf values \(near rows 0:20, columns 0:20\); "
                                               r"pass --nan-fill VALUE to replace them$"):
        convert(tmp_path / "c.tif", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
