"""Bands a source flags bad (an ENVI ``bbl``: AVIRIS's water-vapour bands are noise) are never chosen for the
user: a loader's ``wavelengths=``, a checkpoint's wavelengths at predict, a collection's entries, the preview's
false colour. ENVI files written by SPy; the bands expected computed by hand with numpy."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hsgds
from hsgds.errors import ConfigError, StoreError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.preview import pick_bands, preview_panels

envi = pytest.importorskip("spectral.io.envi")

H, W, B = 12, 10, 9
BBL = [1, 1, 0, 0, 1, 1, 1, 0, 1]  # bands 2, 3 and 7 bad
BAD = [2, 3, 7]
NM = [400.0, 450.0, 498.0, 503.0, 508.0, 600.0, 650.0, 700.0, 750.0]


def aviris_like(seed: int = 0) -> np.ndarray:
    """int16 reflectance; the bad bands hold noise (not zeros: a pick of one shows in the values)."""
    return np.random.default_rng(seed).integers(0, 9000, (H, W, B)).astype(np.int16)


def envi_store(tmp_path, name: str = "scene", seed: int = 0, bbl=BBL, nm=NM):
    cube = aviris_like(seed)
    meta = {"wavelength": nm, "wavelength units": "Nanometers"}
    if bbl is not None:
        meta["bbl"] = bbl
    envi.save_image(str(tmp_path / f"{name}.hdr"), cube, metadata=meta, force=True, interleave="bil")
    return convert(tmp_path / f"{name}.hdr", tmp_path / f"{name}.zarr", ConvertOptions(max_patch=3)), cube


def nearest_good(want: float, tolerance: float, bad=BAD, nm=NM) -> int | None:
    """By hand: the band nearest ``want`` among those not flagged bad, or None beyond ``tolerance``."""
    good = [i for i in range(len(nm)) if i not in bad]
    best = min(good, key=lambda i: abs(nm[i] - want))
    return best if abs(nm[best] - want) <= tolerance else None


def zscored(cube: np.ndarray, band: int | None) -> np.ndarray:
    """A band z-scored over every pixel (no train split: the store's statistics are every pixel's)."""
    assert band is not None
    v = cube[:, :, band].astype(np.float64)
    return (v - v.mean()) / v.std()


def all_patches(store, **kw) -> np.ndarray:
    """Every pixel's 1x1 patch as an (H, W, bands) array, from a CPU loader."""
    out = None
    with hsgds.PatchLoader(store, patch_size=1, batch_size=29, pixels="all", split=None, shuffle=False,
                           return_coords=True, dtype=torch.float64, device="cpu", **kw) as loader:
        for x, _, coords in loader:
            c = coords.numpy()
            if out is None:
                out = np.full((H, W, x.shape[1]), np.nan)
            out[c[:, -2], c[:, -1]] = x.numpy()[:, :, 0, 0]
    assert out is not None
    return out


def test_wavelengths_take_the_nearest_good_band(tmp_path):
    """502 nm is nearest band 3 (503 nm, flagged bad): the loader takes band 4 (508 nm), the nearest good band
    within 10 nm; 598 nm has a good band nearest anyway (band 5)."""
    store, cube = envi_store(tmp_path)
    want = [502.0, 598.0]
    picked = [nearest_good(w, 10.0) for w in want]
    assert picked == [4, 5]
    got = all_patches(store, wavelengths=want, wavelength_tolerance=10.0)
    for k, band in enumerate(picked):
        np.testing.assert_allclose(got[:, :, k], zscored(cube, band), rtol=1e-12, atol=1e-12)


def test_a_wavelength_whose_only_near_band_is_bad_is_refused_in_one_line(tmp_path):
    store, _ = envi_store(tmp_path)
    assert nearest_good(697.0, 10.0) is None  # band 7 (700 nm) is near, but bad
    with pytest.raises(ConfigError) as err:
        hsgds.PatchLoader(store, patch_size=1, batch_size=8, pixels="all", split=None, wavelengths=[450.0, 697.0], wavelength_tolerance=10.0,
                          device="cpu")
    assert str(err.value) == (
        "scene 'scene' has no good band within 10 nm of 697 nm: the nearest, band 7 (700 nm), is flagged bad by the "
        "source (bbl); drop that wavelength, raise wavelength_tolerance to reach a good band, or pass bands= "
        "(indices) to take the bad band on purpose")
    # a tolerance that reaches a good band takes it (650 nm, band 6)
    assert nearest_good(697.0, 50.0) == 6
    with hsgds.PatchLoader(store, patch_size=1, batch_size=8, pixels="all", split=None, wavelengths=[697.0], wavelength_tolerance=50.0,
                           device="cpu") as loader:
        assert loader.wavelengths == [697.0]


def test_bands_naming_a_bad_band_take_it_as_given(tmp_path):
    """Indices are taken as given, bad or not, without a warning: the flag is the source's advice."""
    store, cube = envi_store(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = all_patches(store, bands=[3, 4])
    np.testing.assert_allclose(got[:, :, 0], zscored(cube, 3), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[:, :, 1], zscored(cube, 4), rtol=1e-12, atol=1e-12)


def test_a_store_without_bbl_takes_the_nearest_band(tmp_path):
    store, cube = envi_store(tmp_path, bbl=None)
    got = all_patches(store, wavelengths=[502.0], wavelength_tolerance=10.0)
    np.testing.assert_allclose(got[:, :, 0], zscored(cube, nearest_good(502.0, 10.0, bad=[])), rtol=1e-12,
                               atol=1e-12)


class SignOfBand(nn.Module):
    """Logits (x, -x) of a 1x1 patch's one band: class 1 where the band's z-score is positive, else 2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x[:, 0, 0, 0]
        return torch.stack([v, -v], dim=1)


def test_a_checkpoints_wavelengths_take_the_good_band_at_predict(tmp_path):
    from hsgds.models import LoadedModel

    store, cube = envi_store(tmp_path)
    model = LoadedModel(module=SignOfBand(), kind="checkpoint", bands=None, patch_size=1, classes=2,
                        wavelengths=[502.0], wavelength_tolerance=10.0)
    classmap = hsgds.predict(store, model, device="cpu", dtype=torch.float64)
    np.testing.assert_array_equal(classmap, np.where(zscored(cube, nearest_good(502.0, 10.0)) > 0, 1, 2))
    far = LoadedModel(module=SignOfBand(), kind="checkpoint", bands=None, patch_size=1, classes=2,
                      wavelengths=[697.0], wavelength_tolerance=10.0)
    with pytest.raises(ConfigError, match=r"^the model was trained on a band selection that scene '.*scene\.zarr' "
                                          r"cannot give: scene '.*' has no good band within 10 nm of 697 nm: the "
                                          r"nearest, band 7 \(700 nm\), is flagged bad by the source \(bbl\); the "
                                          r"model was trained on that wavelength, so this scene cannot be predicted "
                                          r"with it; use a model trained on bands this scene has$"):
        hsgds.predict(store, far, device="cpu")


def collection_of_two(tmp_path):
    """Scenes a (bbl: bands 2, 3, 7 bad) and b (no bbl), listed by SceneEntry.of_scene as convert-many does."""
    from hsgds.collection import SceneEntry, write_collection

    a, cube_a = envi_store(tmp_path, "a", seed=1)
    b, cube_b = envi_store(tmp_path, "b", seed=2, bbl=None)
    write_collection(tmp_path, [SceneEntry.of_scene(n, hsgds.open_scene(p)) for n, p in (("a", a), ("b", b))])
    return tmp_path / "collection.json", cube_a, cube_b


def test_a_collection_lists_bad_bands_and_selects_without_opening_a_store(tmp_path):
    path, _, _ = collection_of_two(tmp_path)
    listed = json.loads(path.read_text())
    assert [e["bad_bands"] for e in listed["scenes"]] == [BAD, None]
    assert listed["format_version"] == 1  # an older hsgds reads it (and ignores the key)
    coll = hsgds.open_collection(path)
    assert coll.bad_bands == [tuple(BAD), None]
    with hsgds.PatchLoader(coll, patch_size=1, batch_size=8, pixels="all", split=None, wavelengths=[502.0], wavelength_tolerance=10.0,
                           device="cpu") as loader:
        assert not any(s.is_open for s in loader.scenes.scenes)
        assert [list(s) for s in loader._selection] == [[nearest_good(502.0, 10.0)],
                                                        [nearest_good(502.0, 10.0, bad=[])]]


def test_an_older_collection_json_without_bad_bands_reads_them_from_the_stores(tmp_path):
    path, cube_a, cube_b = collection_of_two(tmp_path)
    listed = json.loads(path.read_text())
    for e in listed["scenes"]:
        del e["bad_bands"]  # as an hsgds before they were listed wrote it
    path.write_text(json.dumps(listed))
    coll = hsgds.open_collection(path)
    assert coll.bad_bands == [tuple(BAD), None]
    with hsgds.PatchLoader(coll, patch_size=1, batch_size=8, pixels="all", split=None, wavelengths=[502.0], wavelength_tolerance=10.0,
                           device="cpu") as loader:
        assert [list(s) for s in loader._selection] == [[4], [3]]
    with pytest.raises(ConfigError, match=r"^scene 'a' has no good band within 10 nm of 697 nm: the nearest, band 7 "):
        hsgds.PatchLoader(path, patch_size=1, batch_size=8, pixels="all", split=None, wavelengths=[697.0], wavelength_tolerance=10.0,
                          device="cpu")


def test_the_tolerance_suggested_over_a_collection_reaches_good_bands(tmp_path):
    """697 nm within 1 nm: scene a's nearest band (700 nm) is bad, its nearest good one 650 nm, 47 nm away (by
    hand); scene b's nearest is 700 nm. The message names the bad band and suggests the tolerance that gives
    every scene a good band (47), not the 3 nm that would only meet the bad one."""
    path, _, _ = collection_of_two(tmp_path)
    assert abs(NM[nearest_good(697.0, np.inf)] - 697.0) == 47.0
    with pytest.raises(ConfigError) as err:
        hsgds.PatchLoader(path, patch_size=1, batch_size=8, pixels="all", split=None, wavelengths=[697.0],
                          wavelength_tolerance=1.0, device="cpu")
    assert str(err.value) == (
        "scene 'a' has no band within 1 nm of 697 nm (nearest: 700 nm, flagged bad by the source; the nearest good "
        "band: 650 nm); raise wavelength_tolerance or drop that wavelength (2 of 2 scenes lack a band within 1 nm of "
        "one; wavelength_tolerance=47 gives each scene a band near every one)")


def test_a_collection_entry_with_damaged_bad_bands_is_one_line(tmp_path):
    path, _, _ = collection_of_two(tmp_path)
    listed = json.loads(path.read_text())
    listed["scenes"][0]["bad_bands"] = [3, 2]
    path.write_text(json.dumps(listed))
    with pytest.raises(StoreError, match=r"^.*collection\.json: scene 0 \('a'\): bad_bands must be null or ascending "
                                         rf"band indices in 0\.\.{B - 1}; write it again with `hsgds convert-many`$"):
        hsgds.open_collection(path)


def test_a_store_whose_bad_bands_changed_since_the_listing_is_named(tmp_path):
    path, _, _ = collection_of_two(tmp_path)
    root = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    root["attributes"]["hsgds"]["bad_bands"] = [2]
    (tmp_path / "a.zarr" / "zarr.json").write_text(json.dumps(root))
    coll = hsgds.open_collection(path)
    problem = coll.listing_problem(0, hsgds.open_scene(tmp_path / "a.zarr"))
    assert problem is not None and "its bad bands differ from collection.json" in problem


def test_convert_many_lists_each_scenes_bad_bands(tmp_path):
    from hsgds.preprocess.convert_many import convert_many

    cube = aviris_like(3)
    envi.save_image(str(tmp_path / "a.hdr"), cube, metadata={"bbl": BBL, "wavelength": NM}, force=True,
                    interleave="bil")
    envi.save_image(str(tmp_path / "b.hdr"), cube, metadata={"wavelength": NM}, force=True, interleave="bil")
    (tmp_path / "m.csv").write_text("source\na.hdr\nb.hdr\n")
    convert_many(tmp_path / "m.csv", tmp_path / "coll", ConvertOptions(max_patch=3), workers=1)
    listed = json.loads((tmp_path / "coll" / "collection.json").read_text())
    assert {e["name"]: e["bad_bands"] for e in listed["scenes"]} == {"a": BAD, "b": None}


def test_the_preview_never_shows_a_bad_band(tmp_path):
    """Nearest 640/550/460 nm by hand among the good bands; without wavelengths, the good band nearest 3/4, 1/2
    and 1/4 of the range; chosen bands are taken as given."""
    nm = [460.0, 470.0, 550.0, 560.0, 600.0, 640.0, 700.0, 800.0, 900.0]
    bad = [0, 2, 5]
    expect = tuple(nearest_good(t, np.inf, bad=bad, nm=nm) for t in (640.0, 550.0, 460.0))
    assert expect == (4, 3, 1)
    assert pick_bands(B, nm, bad=bad) == (expect, "bands 4/3/1 nearest 640/550/460 nm (600/560/470 nm); bands "
                                                  "flagged bad by the source skipped")
    assert pick_bands(B, nm, bad=[8]) == ((5, 2, 0), "bands 5/2/0 nearest 640/550/460 nm (640/550/460 nm)")
    # 3/4, 1/2, 1/4 of 0..8 are bands 6, 4, 2; band 2 is bad: 1 and 3 are as near, the lower is taken
    assert pick_bands(B, None, bad=[2, 6]) == ((5, 4, 1), "bands 5/4/1 (no wavelengths: at 3/4, 1/2, 1/4 of the "
                                                          "range); bands flagged bad by the source skipped")
    assert pick_bands(B, None, bad=list(range(B)))[0] == (6, 4, 2)  # every band bad: as if none were
    assert pick_bands(B, nm, bands=(0, 2, 5), bad=bad)[0] == (0, 2, 5)
    store, _ = envi_store(tmp_path, bbl=[0 if i in bad else 1 for i in range(B)], nm=nm)
    assert preview_panels(store).bands == expect


def test_to_xarray_flags_the_bad_bands(tmp_path):
    pytest.importorskip("xarray")
    store, _ = envi_store(tmp_path)
    da = hsgds.open_scene(store).to_xarray()
    np.testing.assert_array_equal(da["bad"].values, [i in BAD for i in range(B)])
    assert da["bad"].dims == ("band",)
    assert list(da.sel(band=~da["bad"])["band"].values) == [i for i in range(B) if i not in BAD]
    plain, _ = envi_store(tmp_path, "plain", bbl=None)
    assert "bad" not in hsgds.open_scene(plain).to_xarray().coords


def test_cli_predict_names_a_collection_scene_whose_checkpoint_wavelength_is_only_near_a_bad_band(tmp_path, run_cli):
    """From collection.json's bad_bands, before any scene is predicted: exit 2, one line naming the scene."""
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    path, _, _ = collection_of_two(tmp_path)
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "model.ckpt", SpectralSpatialCNN(1, 2, 1, reduce=1, width=4), patch_size=1,
                           wavelengths=[697.0], wavelength_tolerance=10.0)
    code, out, err = run_cli("predict", path, "--model", ckpt, "-o", tmp_path / "{name}.npy")
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        f"hsgds: error: {ckpt} was trained on a band selection that scene 'a' cannot give: scene 'a' has no good "
        "band within 10 nm of 697 nm: the nearest, band 7 (700 nm), is flagged bad by the source (bbl); the model "
        "was trained on that wavelength, so this scene cannot be predicted with it; use a model trained on bands "
        "this scene has")
    assert not list(tmp_path.glob("*.npy"))
