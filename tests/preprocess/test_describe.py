"""``hsgds info SOURCE``: a source file described as the converter sees it, before converting. Sources are
written independently (rasterio, SPy, h5py, numpy) and every figure printed is checked against what was
written."""

from __future__ import annotations

import re

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
envi = pytest.importorskip("spectral.io.envi")


def test_geotiff_with_nodata_and_crs(tmp_path, run_cli):
    from rasterio.transform import Affine

    cube = np.random.default_rng(0).integers(0, 900, (4, 31, 23)).astype(np.int16)
    cube[:, :5] = -9999
    with rasterio.open(tmp_path / "line.tif", "w", driver="GTiff", height=31, width=23, count=4, dtype="int16",
                       nodata=-9999, crs="EPSG:32611", transform=Affine(15.0, 0.0, 500000.0, 0.0, -15.0, 4200000.0)) as d:
        d.write(cube)
    code, out, err = run_cli("info", tmp_path / "line.tif")
    assert code == 0, err
    lines = dict(line.split(":", 1) for line in out.strip().splitlines())
    assert lines["cube"].strip() == "31x23x4 int16 (rows x columns x bands)"
    assert lines["georef"].strip() == "EPSG:32611; origin (500000, 4200000), pixel 15 x -15"
    assert lines["nodata"].strip().startswith("-9999 (GDAL_NODATA tag): a pixel with every band at it is left out")
    assert "no wavelengths recorded" in lines["bands"]
    assert lines["source"].strip() == f"{tmp_path / 'line.tif'} (GeoTIFF/TIFF, {(tmp_path / 'line.tif').stat().st_size} bytes)"


def test_envi_cube_counts_header_and_binary(tmp_path, run_cli):
    cube = np.zeros((12, 10, 5), np.uint16)
    nm = [450.0, 550.0, 650.0, 750.0, 850.0]
    envi.save_image(str(tmp_path / "c.hdr"), cube, metadata={"wavelength": nm, "wavelength units": "nm"},
                    interleave="bil", ext=".img")
    code, out, err = run_cli("info", tmp_path / "c.hdr")
    assert code == 0, err
    size = (tmp_path / "c.hdr").stat().st_size + (tmp_path / "c.img").stat().st_size
    assert f"(ENVI (.hdr + binary), {size} bytes)" in out
    assert "bands:      5 bands, 450.0-850.0 nm" in out
    assert "nodata:     none recorded (pass --nodata VALUE" in out and "georef:     none" in out


def test_enmap_image_counts_its_metadata_file_and_names_it_for_the_wavelengths(tmp_path, run_cli):
    from tests.sensors import ENMAP_L2A, enmap_xml, write_enmap

    src = write_enmap(tmp_path, np.zeros((9, 8, 4), np.int16), enmap_xml(["418.4", "650.0", "1010.5", "2445.5"]))
    xml = tmp_path / f"{ENMAP_L2A}-METADATA.XML"
    code, out, err = run_cli("info", src)
    assert code == 0, err
    assert f"(GeoTIFF/TIFF, {src.stat().st_size + xml.stat().st_size} bytes)" in out
    assert f"bands:      4 bands, 418.4-2445.5 nm (from {xml.name})" in out


def test_hdf5_with_several_cubes_needs_a_key(tmp_path, run_cli):
    import h5py

    with h5py.File(tmp_path / "two.h5", "w") as f:
        f.create_dataset("radiance", data=np.zeros((6, 7, 3), np.float32))
        f.create_dataset("reflectance", data=np.zeros((6, 7, 4), np.float32)).attrs["_FillValue"] = np.float32(-9999)
    code, _, err = run_cli("info", tmp_path / "two.h5")
    assert code == 2 and "radiance" in err and "reflectance" in err and "--key" in err
    code, out, err = run_cli("info", tmp_path / "two.h5", "--key", "reflectance")
    assert code == 0, err
    assert "cube:       6x7x4 float32" in out and "nodata:     -9999 (_FillValue attribute)" in out


def test_several_cubes_beside_a_label_map_need_a_key(tmp_path, run_cli):
    """A .mat holding two cubes and their ground truth was described as that label map ("use: hsgds convert
    CUBE --labels two.mat"), hiding that the file holds cubes that need --key; so were two masks as no cube."""
    import scipy.io

    rng = np.random.default_rng(4)
    gt = rng.integers(0, 3, (9, 8)).astype(np.float64)
    scipy.io.savemat(tmp_path / "two.mat", {"a": rng.random((9, 8, 3)), "b": rng.random((9, 8, 3)), "gt": gt})
    code, out, err = run_cli("info", tmp_path / "two.mat")
    assert code == 2 and "labels:" not in out
    assert "two.mat holds several 3-D arrays (a (9, 8, 3), b (9, 8, 3)); choose one with --key" in err
    code, out, err = run_cli("info", tmp_path / "two.mat", "--key", "b")
    assert code == 0 and "cube:       9x8x3 float64" in out, err
    scipy.io.savemat(tmp_path / "masks.mat", {"train": gt, "test": gt})
    code, _, err = run_cli("info", tmp_path / "masks.mat")
    assert code == 2 and "holds several 2-D arrays (test (9, 8), train (9, 8)); choose one with --key" in err


def test_the_suggested_command_keeps_the_options_the_source_needed(tmp_path, run_cli, monkeypatch):
    """The convert line of a PRISMA-like HE5 cube described with --key and --band-axis dropped both, so the
    command it suggested failed ("holds several 3-D arrays"); a label map chosen with --key is --labels-key
    in convert. Each suggested command is run as printed (shlex split, as a shell would) and checked with h5py."""
    import shlex

    import h5py

    import hsgds

    rng = np.random.default_rng(5)
    vnir = rng.integers(0, 900, (9, 4, 8)).astype(np.uint16)  # (H, B, W), PRISMA's line-interleaved layout
    key = "HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields/VNIR_Cube"
    gt = rng.integers(0, 3, (9, 8)).astype(np.uint8)
    with h5py.File(tmp_path / "prs.he5", "w") as f:
        f[key] = vnir
        f["HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields/SWIR_Cube"] = vnir[:, :3]
        f["gt"], f["mask"] = gt, gt
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("info", "prs.he5", "--key", key, "--band-axis", "middle")
    assert code == 0, err
    convert = out.strip().splitlines()[-1]
    assert convert == (f"convert:    hsgds convert prs.he5 --key '{key}' --band-axis middle -o prs.zarr "
                       "[--labels GT]"), convert
    code, out, err = run_cli("info", "prs.he5", "--key", "gt")
    assert code == 0, err
    use = out.strip().splitlines()[-1]
    assert use == "use:        hsgds convert CUBE --labels prs.he5 --labels-key gt -o scene.zarr", use
    args = shlex.split(convert.split(":", 1)[1].replace("[--labels GT]", ""))[2:]
    args += shlex.split(use.split(":", 1)[1].replace("CUBE", ""))[2:-2]  # --labels ... --labels-key gt
    code, _, err = run_cli("convert", *args, "--max-patch", "3")
    assert code == 0, err
    with h5py.File(tmp_path / "prs.he5") as f:
        expected, labels = f[key][()].transpose(0, 2, 1), f["gt"][()]
    scene = hsgds.open_scene(tmp_path / "prs.zarr")
    assert np.array_equal(scene.read(0, 9, 0, 8), expected) and np.array_equal(scene.labels, labels)


def test_a_label_map_is_described_by_its_classes(tmp_path, run_cli):
    labels = np.zeros((9, 8), np.uint8)
    labels[0, :3], labels[5, 5] = 2, 7
    np.save(tmp_path / "gt.npy", labels)
    code, out, err = run_cli("info", tmp_path / "gt.npy")
    assert code == 0, err
    assert re.search(r"labels: +9x8 label map \(single band\): classes 2 \(3\), 7 \(1\); 68 pixels unlabelled", out)


def test_source_options_are_for_sources_and_unknown_files_are_named(tmp_path, run_cli, synthetic_store):
    store = synthetic_store(20, 20, 4, classes=3, seed=1)[0]
    code, _, err = run_cli("info", store, "--key", "x")
    assert code == 2 and "--key and --band-axis describe a source file" in err
    (tmp_path / "notes.txt").write_text("not a cube")
    code, _, err = run_cli("info", tmp_path / "notes.txt")
    assert code == 2 and "cannot tell the format of" in err and len(err.strip().splitlines()) == 1


def test_a_single_band_envi_classification_is_described_as_labels(tmp_path, run_cli):
    """An ENVI Classification file opens as a one-band cube too; info describes it as the label map it is
    (its nodata 255 unlabelled), not as a cube whose 255 would be left out of statistics."""
    labels = np.random.default_rng(3).integers(1, 4, (9, 8)).astype(np.uint8)
    labels[:, :2] = 255
    envi.save_image(str(tmp_path / "gt.hdr"), labels[:, :, None], metadata={"data ignore value": 255}, ext=".img")
    code, out, err = run_cli("info", tmp_path / "gt.hdr")
    assert code == 0, err
    counts = ", ".join(f"{c} ({int((labels == c).sum())})" for c in (1, 2, 3))
    assert f"label map (single band): classes {counts}; 18 pixels unlabelled" in out and "cube:" not in out
    # one band of reflectance (not integer classes) stays a cube
    envi.save_image(str(tmp_path / "r.hdr"), np.full((9, 8, 1), 0.25, np.float32), ext=".img")
    code, out, err = run_cli("info", tmp_path / "r.hdr")
    assert code == 0 and "cube:       9x8x1 float32" in out, err
