"""GDAL's per-band scale and offset (SetScale / SetOffset, rasterio's ``scales`` / ``offsets``: int16 reflectance
times 0.0001; an ENVI header's ``data gain values`` / ``data offset values``, which GDAL reads as them) applied as a
CF-packed HDF5 / netCDF variable's scale_factor / add_offset are: GeoTIFFs written by rasterio and ENVI files by
SPy, converted, and the store's values compared with numpy's ``raw * scale + offset``."""

from __future__ import annotations

import sys
import warnings
from contextlib import closing

import numpy as np
import pytest
import tifffile

rasterio = pytest.importorskip("rasterio")

from hsgds.errors import InputError  # noqa: E402 - after the importorskip above
from hsgds.preprocess.convert import ConvertOptions, convert  # noqa: E402
from hsgds.preprocess.describe import describe_source  # noqa: E402
from hsgds.preprocess.readers import open_cube  # noqa: E402
from hsgds.scene import open_scene  # noqa: E402

H, W, B = 13, 11, 4


def write_scaled(path, raw: np.ndarray, scales, offsets, nodata=None, **profile) -> None:
    """``raw`` (B, H, W) written by rasterio with GDAL's per-band scale and offset."""
    with rasterio.Env(), rasterio.open(path, "w", driver="GTiff", height=raw.shape[1], width=raw.shape[2],
                                       count=raw.shape[0], dtype=raw.dtype, nodata=nodata, **profile) as ds:
        ds.write(raw)
        ds.scales, ds.offsets = tuple(scales), tuple(offsets)
    with rasterio.open(path) as ds:  # what GDAL itself reads back: the values the store must be made of
        assert ds.scales == tuple(scales) and ds.offsets == tuple(offsets)


def physical(raw: np.ndarray, scales, offsets) -> np.ndarray:
    """(H, W, B) ``raw * scale + offset`` per band, in float64 as GDAL's doubles give it, then held in float32
    (rounded once) for 8- and 16-bit integers; float64 for wider ones."""
    values = raw.transpose(1, 2, 0).astype(np.float64) * np.asarray(scales) + np.asarray(offsets)
    return values.astype(np.float32) if raw.dtype.itemsize <= 2 else values


def f32(raw: float, scale: float, offset: float) -> float:
    """One 16-bit value unpacked as the store holds it (GDAL's float64 result rounded once to float32)."""
    return float(np.float32(raw * scale + offset))


@pytest.fixture(autouse=True)
def _not_georeferenced_is_fine():
    """These GeoTIFFs have no map grid, which rasterio warns of (and the suite's warnings are errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        yield


@pytest.mark.parametrize("profile", [{"interleave": "pixel"}, {"interleave": "band"},
                                     {"interleave": "pixel", "compress": "deflate", "tiled": True,
                                      "blockxsize": 16, "blockysize": 16}])
@pytest.mark.parametrize(("scales", "offsets"), [((1e-4,) * B, (0.0,) * B),
                                                  ((1e-4, 2e-4, 5e-5, 1e-3), (0.0, -0.1, 0.25, 0.0))])
def test_geotiff_scale_and_offset_reach_the_store(tmp_path, profile, scales, offsets):
    """A GeoTIFF's int16 values are stored as GDAL unscales them, per band: they used to be stored raw."""
    raw = np.random.default_rng(0).integers(-2000, 12000, (B, H, W)).astype(np.int16)
    src = tmp_path / "reflectance.tif"
    write_scaled(src, raw, scales, offsets, **profile)
    scene = open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.dtype == np.float32 and scene.meta.source["dtype"] == "float32"
    np.testing.assert_array_equal(scene.read(0, H, 0, W), physical(raw, scales, offsets))
    stats = scene.stats["all"]
    np.testing.assert_allclose(stats.mean, physical(raw, scales, offsets).astype(np.float64).mean(axis=(0, 1)),
                               rtol=1e-12)


def test_an_offset_cancelling_the_product_is_rounded_once_to_float32(tmp_path):
    """uint16 reflectance times 2.75e-5 minus 0.2 (Landsat Collection 2's packing): the store holds what GDAL itself
    unscales to Float32 (a VRT ComplexSource with the file's ScaleRatio / ScaleOffset, as ``gdal_translate -unscale
    -ot Float32`` makes: float64 arithmetic rounded once). Unpacked in float32 arithmetic, the scale, the product
    and the sum were each rounded, and values near 0 were up to thousands of float32 steps off."""
    raw = np.arange(7000, 7000 + B * H * W, dtype=np.uint16).reshape(B, H, W)  # reflectance -0.0075 .. 0.0075
    src = tmp_path / "surface_reflectance.tif"
    write_scaled(src, raw, (2.75e-5,) * B, (-0.2,) * B)
    with rasterio.open(src) as ds:
        scales, offsets = ds.scales, ds.offsets
    bands = "".join(
        f'<VRTRasterBand dataType="Float32" band="{b + 1}"><ComplexSource><SourceFilename relativeToVRT="1">'
        f"{src.name}</SourceFilename><SourceBand>{b + 1}</SourceBand><ScaleOffset>{offsets[b]!r}</ScaleOffset>"
        f"<ScaleRatio>{scales[b]!r}</ScaleRatio></ComplexSource></VRTRasterBand>" for b in range(B))
    vrt = tmp_path / "unscaled.vrt"
    vrt.write_text(f'<VRTDataset rasterXSize="{W}" rasterYSize="{H}">{bands}</VRTDataset>')
    with rasterio.open(vrt) as ds:  # GDAL's own unscaling
        want = ds.read().transpose(1, 2, 0)
    assert want.dtype == np.float32
    scene = open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.dtype == np.float32
    np.testing.assert_array_equal(scene.read(0, H, 0, W), want)
    np.testing.assert_array_equal(want, physical(raw, scales, offsets))  # this file's reference agrees with GDAL


def test_the_tifffile_path_unscales_without_rasterio(tmp_path, monkeypatch):
    """The reader takes the scale and offset from the GDAL_METADATA tag itself, so a machine without rasterio
    (no hsgds[geo]) stores the same physical values, never the raw integers."""
    scales, offsets = (1e-4, 2e-4, 1e-4, 3e-4), (0.0, 0.5, -0.5, 0.0)
    raw = np.random.default_rng(1).integers(0, 10000, (B, H, W)).astype(np.uint16)
    src = tmp_path / "scaled.tif"
    write_scaled(src, raw, scales, offsets)
    monkeypatch.setitem(sys.modules, "rasterio", None)  # as if hsgds[geo] were not installed
    with closing(open_cube(src)) as cube:
        assert cube.dtype == np.float32
        np.testing.assert_array_equal(cube.read(0, H, 0, W), physical(raw, scales, offsets))
        np.testing.assert_array_equal(cube.read(3, 7, 2, 9), physical(raw, scales, offsets)[3:7, 2:9])


def test_one_scale_unpacks_the_nodata_value_as_cf_does(tmp_path):
    """With one scale and offset for every band, GDAL's nodata value reads unpacked (as a CF _FillValue does):
    the pixel holding it in every band is a nodata pixel, read back as that value; one band at it is data."""
    raw = np.random.default_rng(2).integers(0, 10000, (B, H, W)).astype(np.int16)
    raw[:, 2, 3] = -9999
    raw[1, 4, 4] = -9999  # one band only: a pixel with data
    src = tmp_path / "with_nodata.tif"
    write_scaled(src, raw, (1e-4,) * B, (0.01,) * B, nodata=-9999)
    want = physical(raw, (1e-4,) * B, (0.01,) * B)
    with closing(open_cube(src)) as cube:
        assert cube.nodata == f32(-9999, 1e-4, 0.01)
    scene = open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.meta.nodata["value"] == f32(-9999, 1e-4, 0.01) and scene.meta.nodata["pixels"] == 1
    np.testing.assert_array_equal(scene.read(0, H, 0, W), want)
    assert "-0.9899 (GDAL_NODATA tag)" in describe_source(src)


def test_per_band_scales_read_a_nodata_pixel_as_nan(tmp_path):
    """Unpacked by scales that differ by band, GDAL's nodata value would be a different value in each band: a
    pixel holding it in every band reads NaN (the store's nodata value) instead; one band at it is data."""
    scales, offsets = (1e-4, 2e-4, 1e-4, 5e-4), (0.0, 0.0, 0.1, 0.0)
    raw = np.random.default_rng(3).integers(0, 10000, (B, H, W)).astype(np.int16)
    raw[:, 0, 0] = -9999
    raw[2, 5, 6] = -9999
    src = tmp_path / "per_band.tif"
    write_scaled(src, raw, scales, offsets, nodata=-9999)
    want = physical(raw, scales, offsets)
    want[0, 0, :] = np.nan
    scene = open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.meta.nodata["value"] == "nan" and scene.meta.nodata["pixels"] == 1
    np.testing.assert_array_equal(scene.read(0, H, 0, W), want)
    assert scene.read(5, 6, 6, 7)[0, 0, 2] == f32(-9999, 1e-4, 0.1)
    nodata = next(line for line in describe_source(src).splitlines() if line.startswith("nodata:"))
    assert nodata.startswith("nodata:     nan (GDAL_NODATA tag -9999 in every band, read as NaN: the bands' GDAL "
                             "scales and offsets differ)")


def test_info_says_how_the_values_are_unpacked(tmp_path):
    raw = np.zeros((B, H, W), np.int16)
    write_scaled(tmp_path / "one.tif", raw, (1e-4,) * B, (0.0,) * B)
    write_scaled(tmp_path / "many.tif", raw, (1e-4, 2e-4, 2e-4, 1e-4), (0.0,) * B)
    assert (f"cube:       {H}x{W}x{B} float32 (rows x columns x bands, unpacked from int16 by its GDAL scale 0.0001 "
            "and offset 0)") in describe_source(tmp_path / "one.tif")
    assert ("float32 (rows x columns x bands, unpacked from int16 by its per-band GDAL scales 0.0001 to 0.0002 and "
            "offsets 0)") in describe_source(tmp_path / "many.tif")


def test_wide_integers_unpack_to_float64_and_dtype_float32_narrows_them(tmp_path):
    """int32 values need float64 to be unpacked exactly (float32 holds 24 bits); --dtype float32 stores them
    rounded to float32 (half the size)."""
    raw = np.random.default_rng(4).integers(0, 10000, (B, H, W)).astype(np.int32)
    write_scaled(tmp_path / "r.tif", raw, (1e-4,) * B, (0.0,) * B)
    with closing(open_cube(tmp_path / "r.tif")) as cube:
        assert cube.dtype == np.float64
        np.testing.assert_array_equal(cube.read(0, H, 0, W), physical(raw, (1e-4,) * B, (0.0,) * B))
    scene = open_scene(convert(tmp_path / "r.tif", tmp_path / "s.zarr", ConvertOptions(max_patch=3, dtype="float32")))
    assert scene.dtype == np.float32 and scene.meta.source["dtype"] == "float64"
    np.testing.assert_array_equal(scene.read(0, H, 0, W), physical(raw, (1e-4,) * B, (0.0,) * B).astype(np.float32))


def test_no_scale_keeps_the_raw_type(tmp_path):
    """A GeoTIFF whose bands have scale 1 and offset 0 (or none) keeps its integers."""
    raw = np.random.default_rng(5).integers(0, 10000, (B, H, W)).astype(np.int16)
    write_scaled(tmp_path / "plain.tif", raw, (1.0,) * B, (0.0,) * B)
    with closing(open_cube(tmp_path / "plain.tif")) as cube:
        assert cube.dtype == np.int16
        np.testing.assert_array_equal(cube.read(0, H, 0, W), raw.transpose(1, 2, 0))


def _gdal_metadata_tiff(path, items: str) -> None:
    """A TIFF whose GDAL_METADATA tag (42112) holds ``items``, as tifffile writes it."""
    xml = f"<GDALMetadata>{items}</GDALMetadata>"
    tifffile.imwrite(path, np.zeros((H, W, B), np.int16), planarconfig="contig", photometric="minisblack",
                     extratags=[(42112, "s", 0, xml, True)])


@pytest.mark.parametrize(("items", "message"), [
    ('<Item name="SCALE" sample="1" role="scale">abc</Item>',
     r"^bad\.tif: its GDAL metadata gives band 1 the scale 'abc', not a finite number; fix it \(gdal_edit\.py "
     r"-scale \.\.\.\) or remove it$"),
    ('<Item name="OFFSET" sample="0" role="offset">inf</Item>',
     r"^bad\.tif: its GDAL metadata gives band 0 the offset 'inf', not a finite number; fix it \(gdal_edit\.py "
     r"-offset \.\.\.\) or remove it$"),
    (f'<Item name="SCALE" sample="{B}" role="scale">0.001</Item>',
     rf"^bad\.tif: its GDAL metadata gives a scale to band {B}, but the image has {B} bands \(0 to {B - 1}\); fix or "
     r"remove that item$"),
])
def test_a_scale_that_cannot_be_applied_is_one_line(tmp_path, items, message):
    _gdal_metadata_tiff(tmp_path / "bad.tif", items)
    with pytest.raises(InputError, match=message):
        open_cube(tmp_path / "bad.tif")


def test_a_scale_in_a_tag_that_is_no_xml_is_refused(tmp_path):
    tifffile.imwrite(tmp_path / "bad.tif", np.zeros((H, W, B), np.int16), planarconfig="contig", photometric="minisblack",
                     extratags=[(42112, "s", 0, '<GDALMetadata><Item sample="0" role="scale">0.1</Item', True)])
    with pytest.raises(InputError, match=r"^bad\.tif: its GDAL_METADATA tag holds band scales or offsets but is not "
                                         r"XML, so they cannot be applied; fix the tag"):
        open_cube(tmp_path / "bad.tif")


# ------------------------------------------------------------------------------------------- ENVI gains

@pytest.fixture
def envi():
    return pytest.importorskip("spectral.io.envi")  # (SPy writes the ENVI files; the GeoTIFF tests need it not)


@pytest.mark.parametrize(("gains", "offsets"), [((0.01,) * B, (0.0,) * B),
                                                ((0.01, 0.02, 0.005, 0.01), (0.0, 1.0, -2.0, 0.5))])
def test_envi_gains_and_offsets_are_applied_as_gdal_reads_them(tmp_path, envi, gains, offsets):
    """An ENVI header's data gain values and data offset values are the bands' scale and offset to GDAL (checked
    with rasterio): the store holds ``raw * gain + offset``; its data ignore value is a nodata value unpacked as
    GDAL_NODATA is (NaN when the gains differ by band)."""
    raw = np.random.default_rng(6).integers(0, 9000, (H, W, B)).astype(np.int16)
    raw[4, 5, :] = -1
    hdr = tmp_path / "radiance.hdr"
    envi.save_image(str(hdr), raw, force=True, interleave="bil", metadata={
        "data gain values": list(gains), "data offset values": list(offsets), "data ignore value": -1})
    with rasterio.open(tmp_path / "radiance.img") as ds:
        assert ds.scales == gains and ds.offsets == offsets
    want = (raw.astype(np.float64) * np.asarray(gains) + np.asarray(offsets)).astype(np.float32)
    one = len(set(gains)) == 1 and len(set(offsets)) == 1
    want[4, 5, :] = want[4, 5, 0] if one else np.nan
    scene = open_scene(convert(hdr, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.dtype == np.float32 and scene.meta.nodata["pixels"] == 1
    assert scene.meta.nodata["value"] == (f32(-1, 0.01, 0.0) if one else "nan")
    np.testing.assert_array_equal(scene.read(0, H, 0, W), want)
    how = ("ENVI data gain value 0.01 and data offset value 0" if one else
           "per-band ENVI data gain values 0.005 to 0.02 and data offset values -2 to 1")
    assert f"float32 (rows x columns x bands, unpacked from int16 by its {how})" in describe_source(hdr)


def test_envi_gains_that_do_not_fit_are_one_line(tmp_path, envi):
    envi.save_image(str(tmp_path / "r.hdr"), np.zeros((H, W, B), np.int16), force=True,
                    metadata={"data gain values": [0.1, 0.2]})
    with pytest.raises(InputError, match=rf"^ENVI header .*r\.hdr lists 2 data gain values for {B} bands; fix or "
                                         r"remove the 'data gain values' field$"):
        open_cube(tmp_path / "r.hdr")
    envi.save_image(str(tmp_path / "r.hdr"), np.zeros((H, W, B), np.int16), force=True,
                    metadata={"data offset values": ["x"] * B})
    with pytest.raises(InputError, match=r"^ENVI header .*r\.hdr: 'data offset values' holds a value that is no "
                                         r"finite number; fix or remove that field$"):
        open_cube(tmp_path / "r.hdr")
