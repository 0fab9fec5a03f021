"""An ENVI header's ``reflectance scale factor`` (the value which, divided into the data, scales it to 0-1
reflectance) carried into the store's metadata, never applied: ENVI files written by SPy, the factor and the
values compared with SPy's own reading of the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hsgds
from hsgds.errors import StoreError
from hsgds.preprocess.convert import ConvertOptions, convert

envi = pytest.importorskip("spectral.io.envi")

H, W, B = 12, 10, 5


def reflectance(seed: int = 0) -> np.ndarray:
    """int16 reflectance times 10000, as AVIRIS-NG and Hyperion L2 products hold it."""
    return np.random.default_rng(seed).integers(0, 10000, (H, W, B)).astype(np.int16)


def save(path, cube: np.ndarray, **metadata) -> None:
    envi.save_image(str(path), cube, metadata=metadata, force=True, interleave="bil", ext=".img")


def test_the_factor_is_recorded_shown_and_not_applied(tmp_path, run_cli):
    save(tmp_path / "r.hdr", reflectance(), **{"reflectance scale factor": 10000})
    spy = envi.open(str(tmp_path / "r.hdr"))
    assert spy.scale_factor == 10000.0  # SPy reads the field as ENVI defines it
    store = convert(tmp_path / "r.hdr", tmp_path / "s.zarr", ConvertOptions())
    meta = json.loads((store / "zarr.json").read_text())["attributes"]["hsgds"]
    assert meta["reflectance_scale_factor"] == spy.scale_factor
    scene = hsgds.open_scene(store)
    # the values as the file holds them (SPy's memmap of the raw binary), not divided by the factor
    np.testing.assert_array_equal(scene.read(0, H, 0, W), np.asarray(spy.open_memmap()))
    assert scene.meta.reflectance_scale_factor == 10000.0
    assert scene.to_xarray().attrs["reflectance_scale_factor"] == 10000.0
    want = "scale:      divided by 10000 the values are 0-1 reflectance (the source's reflectance scale factor"
    for target in (store, tmp_path / "r.hdr"):  # the store, and the source as the converter will read it
        code, out, _ = run_cli("info", target)
        assert code == 0 and want in out, out


def test_a_source_without_the_field_records_none(tmp_path, run_cli):
    save(tmp_path / "r.hdr", reflectance())
    store = convert(tmp_path / "r.hdr", tmp_path / "s.zarr", ConvertOptions())
    scene = hsgds.open_scene(store)
    assert scene.meta.reflectance_scale_factor is None
    assert "reflectance_scale_factor" not in scene.to_xarray().attrs
    code, out, _ = run_cli("info", store)
    assert code == 0 and "scale:" not in out
    # a store written before the field existed (no key at all) opens as one without a factor
    root = store / "zarr.json"
    doc = json.loads(root.read_text())
    del doc["attributes"]["hsgds"]["reflectance_scale_factor"]
    root.write_text(json.dumps(doc))
    assert hsgds.open_scene(store).meta.reflectance_scale_factor is None


@pytest.mark.parametrize("value", ["ten thousand", "0", "-10000", "inf", "nan", "{1, 2}"])
def test_a_factor_that_is_no_positive_number_is_one_line(tmp_path, run_cli, value):
    save(tmp_path / "r.hdr", reflectance())
    header = tmp_path / "r.hdr"
    header.write_text(header.read_text() + f"reflectance scale factor = {value}\n")
    for command in (("convert", header, "-o", tmp_path / "s.zarr"), ("info", header)):
        code, _, err = run_cli(*command)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"ENVI header {header}: 'reflectance scale factor' holds " in err, err
        assert "fix or remove that field" in err, err
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("value", ["x", 0, -1, float("inf"), True])
def test_a_store_with_a_damaged_factor_is_refused(tmp_path, value):
    save(tmp_path / "r.hdr", reflectance(), **{"reflectance scale factor": 10000})
    store = convert(tmp_path / "r.hdr", tmp_path / "s.zarr", ConvertOptions())
    root = store / "zarr.json"
    doc = json.loads(root.read_text())
    doc["attributes"]["hsgds"]["reflectance_scale_factor"] = value
    root.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=r"reflectance_scale_factor = .* \(must be a finite number above 0 or null\); convert"):
        hsgds.open_scene(store)
