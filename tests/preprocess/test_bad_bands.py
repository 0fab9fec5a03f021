"""An ENVI bad band list (``bbl``: 0 marks a bad band, as AVIRIS's water-vapour bands) carried into the store:
ENVI files written by SPy, the store's metadata read back as JSON, and the loader's patches over ``good_bands``
compared with numpy's."""

from __future__ import annotations

import json
import warnings
from contextlib import closing

import numpy as np
import pytest
import torch

import hsgds
from hsgds.errors import InputError, StoreError
from hsgds.info import describe
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.preprocess.describe import describe_source
from hsgds.preprocess.readers import open_cube

envi = pytest.importorskip("spectral.io.envi")

H, W, B = 12, 10, 9
BBL = [1, 1, 0, 0, 1, 1, 1, 0, 1]  # bands 2, 3 and 7 bad
BAD, GOOD = [2, 3, 7], [0, 1, 4, 5, 6, 8]


def aviris_like(seed: int = 0) -> np.ndarray:
    """int16 reflectance whose bad bands hold zeros, as AVIRIS's water-vapour bands do."""
    cube = np.random.default_rng(seed).integers(0, 9000, (H, W, B)).astype(np.int16)
    cube[:, :, BAD] = 0
    return cube


def save(path, cube: np.ndarray, bbl=BBL, **metadata) -> None:
    meta = dict(metadata) if bbl is None else {"bbl": bbl, **metadata}
    envi.save_image(str(path), cube, metadata=meta, force=True, interleave="bil")


def test_bbl_is_recorded_and_gives_the_good_bands(tmp_path):
    cube = aviris_like()
    save(tmp_path / "scene.hdr", cube)
    with closing(open_cube(tmp_path / "scene.hdr")) as source:
        assert source.bad_bands == BAD
    store = convert(tmp_path / "scene.hdr", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    attrs = json.loads((store / "zarr.json").read_text())["attributes"]["hsgds"]  # as any JSON reader sees it
    assert attrs["bad_bands"] == BAD
    assert attrs["format_version"] == 2  # an older hsgds reads the store as before: the bands are all there
    scene = hsgds.open_scene(store)
    assert scene.bad_bands == BAD and scene.good_bands == GOOD
    np.testing.assert_array_equal(scene.read(0, H, 0, W), cube)  # the bad bands stay in the cube


def test_a_source_without_bbl_records_none_and_every_band_is_good(tmp_path):
    save(tmp_path / "plain.hdr", aviris_like(), bbl=None)
    scene = hsgds.open_scene(convert(tmp_path / "plain.hdr", tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.bad_bands is None and scene.good_bands == list(range(B))
    assert "bad bands" not in describe(scene.path)
    save(tmp_path / "all_good.hdr", aviris_like(), bbl=[1] * B)
    scene = hsgds.open_scene(convert(tmp_path / "all_good.hdr", tmp_path / "g.zarr", ConvertOptions(max_patch=3)))
    assert scene.bad_bands == [] and scene.good_bands == list(range(B))


def test_info_shows_the_bad_bands_of_the_source_and_the_store(tmp_path):
    save(tmp_path / "scene.hdr", aviris_like())
    source = dict(line.split(":", 1) for line in describe_source(tmp_path / "scene.hdr").splitlines())
    assert source["bad bands"].strip() == (f"3 of {B} flagged bad by the source (bbl): 2-3, 7; the store records "
                                           "them (Scene.bad_bands)")
    convert(tmp_path / "scene.hdr", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    store = dict(line.split(":", 1) for line in describe(tmp_path / "s.zarr").splitlines() if ":" in line)
    assert store["bad bands"].strip() == (f"3 of {B} flagged bad by the source (bbl): 2-3, 7; bands=scene.good_bands "
                                          "leaves them out, and wavelengths=[...] never selects one")


def test_info_of_a_collection_sums_up_its_scenes_bad_bands(tmp_path, run_cli):
    """`hsgds info COLLECTION` says how many scenes flag bad bands and their commonest runs, from the
    collection.json that convert-many wrote from SPy's ENVI files (bbl as each header lists it)."""
    pytest.importorskip("distributed")
    flags = {"a": BBL, "b": [1, 1, 0, 0, 1, 1, 1, 1, 1], "c": None}  # a: 2-3, 7; b: 2-3; c: no bbl
    for name, bbl in flags.items():
        save(tmp_path / f"{name}.hdr", aviris_like(), bbl=bbl)
    (tmp_path / "scenes.csv").write_text("source\n" + "".join(f"{name}.hdr\n" for name in flags))
    code, _, err = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "coll", "--max-patch", "3",
                           "--workers", "1")
    assert code == 0, err
    listing = json.loads((tmp_path / "coll" / "collection.json").read_text())  # as any JSON reader sees it
    bad = {name: [i for i, f in enumerate(bbl) if f == 0] if bbl else None for name, bbl in flags.items()}
    assert {e["name"]: e["bad_bands"] for e in listing["scenes"]} == bad
    code, out, err = run_cli("info", tmp_path / "coll")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("bad bands:")]
    assert lines == ["bad bands:  2 of 3 scenes flag bad bands (bbl): 2-3 (2 scenes), 7 (1 scene); a loader's "
                     "wavelengths=[...] never selects one"], out


def _all_patches(store, **kw) -> tuple[np.ndarray, np.ndarray]:
    """Every pixel's 1x1 patch (N, bands) and its (y, x), from a CPU loader over the whole scene."""
    got, where = [], []
    with hsgds.PatchLoader(store, patch_size=1, batch_size=37, pixels="all", split=None, shuffle=False,
                           return_coords=True, dtype=torch.float64, device="cpu", **kw) as loader:
        for x, _, coords in loader:
            got.append(x.numpy()[:, :, 0, 0])
            where.append(coords.numpy())
    return np.concatenate(got), np.concatenate(where)


def test_all_zero_bad_bands_z_score_to_zero_and_good_bands_leave_them_out(tmp_path):
    """A bad band of zeros has std 0: z-scored it reads 0, never NaN or inf; bands=scene.good_bands gives the
    other bands, z-scored as numpy does over the scene's pixels (no train split: every pixel's statistics)."""
    cube = aviris_like(1)
    save(tmp_path / "scene.hdr", cube)
    store = convert(tmp_path / "scene.hdr", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    scene = hsgds.open_scene(store)
    flat = cube.reshape(-1, B).astype(np.float64)
    mean, std = flat.mean(0), flat.std(0)
    assert (std[BAD] == 0).all() and (scene.stats["all"].std[BAD] == 0).all()

    everything, where = _all_patches(store)
    assert len(everything) == H * W and np.isfinite(everything).all()
    assert (everything[:, BAD] == 0).all()

    good, where = _all_patches(store, bands=scene.good_bands)
    assert good.shape == (H * W, len(GOOD))
    spectra = cube[where[:, 0], where[:, 1]][:, GOOD].astype(np.float64)
    np.testing.assert_allclose(good, (spectra - mean[GOOD]) / std[GOOD], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("bbl", "message"), [
    ([1, 0, 1], rf"^ENVI header .*scene\.hdr lists 3 'bbl' flags for {B} bands; fix or remove the 'bbl' field$"),
    ([1, 0.5] + [1] * (B - 2), r"^ENVI header .*scene\.hdr: 'bbl' holds '0\.5', not 0 \(a bad band\) or 1 \(a good "
                               r"one\); fix or remove the 'bbl' field$"),
])
def test_a_bbl_that_does_not_fit_is_one_line(tmp_path, bbl, message):
    save(tmp_path / "scene.hdr", aviris_like(), bbl=bbl)
    with pytest.raises(InputError, match=message):
        open_cube(tmp_path / "scene.hdr")


def test_a_store_with_damaged_bad_bands_is_refused(tmp_path):
    save(tmp_path / "scene.hdr", aviris_like())
    store = convert(tmp_path / "scene.hdr", tmp_path / "s.zarr", ConvertOptions(max_patch=3))
    root = json.loads((store / "zarr.json").read_text())
    root["attributes"]["hsgds"]["bad_bands"] = [3, 2, B]
    (store / "zarr.json").write_text(json.dumps(root))
    with pytest.raises(StoreError, match=rf"invalid hsgds metadata: bad_bands = \[3, 2, {B}\] \(must be ascending "
                                         rf"band indices in 0\.\.{B - 1}, or null\); convert the source again$"):
        hsgds.open_scene(store)


def test_convert_many_converts_again_when_the_bbl_changes(tmp_path):
    """A store made before hsgds recorded bad bands (or from a header whose bbl was edited since) is converted
    again, saying why; one whose bad bands match is up to date."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    save(tmp_path / "scene.hdr", aviris_like())
    row = ManifestRow(name="scene", source=tmp_path / "scene.hdr")
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    assert convert_scene(row, out, opts).status == "converted"
    assert convert_scene(row, out, opts).status == "up to date"
    root = json.loads((out / "scene.zarr" / "zarr.json").read_text())
    del root["attributes"]["hsgds"]["bad_bands"]  # as an hsgds before bad bands wrote it
    (out / "scene.zarr" / "zarr.json").write_text(json.dumps(root))
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == ("converted", "bad bands: the source flags bands 2, 3, 7, the store none "
                                                          "(no bbl)")
    assert convert_scene(row, out, opts).status == "up to date"
    header = (tmp_path / "scene.hdr").read_text()
    assert "bbl = { 1 , 1 , 0 , 0 ," in header
    (tmp_path / "scene.hdr").write_text(header.replace("bbl = { 1 , 1 , 0 , 0 ,", "bbl = { 1 , 1 , 1 , 0 ,"))
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == ("converted", "bad bands: the source flags bands 3, 7, the store bands "
                                                          "2, 3, 7")
    assert hsgds.open_scene(out / "scene.zarr").bad_bands == [3, 7]


def test_a_geotiff_bbl_item_is_recorded(tmp_path):
    """An ENVI-style bbl kept in a GeoTIFF's GDAL metadata (rasterio's update_tags(bbl=...))."""
    rasterio = pytest.importorskip("rasterio")
    cube = aviris_like(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(tmp_path / "s.tif", "w", driver="GTiff", height=H, width=W, count=B, dtype="int16") as ds:
            ds.write(cube.transpose(2, 0, 1))
            ds.update_tags(bbl="{" + ", ".join(map(str, BBL)) + "}")
    scene = hsgds.open_scene(convert(tmp_path / "s.tif", tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.bad_bands == BAD and scene.good_bands == GOOD
