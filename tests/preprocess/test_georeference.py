"""Georeference carried from the source into the store: GeoTIFFs written by rasterio and ENVI files written
by SPy, each read back independently by rasterio/GDAL (the field's reference) and compared with what the
converter stored; `hsgds info` shows it; old stores without it still open."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
envi = pytest.importorskip("spectral.io.envi")
from rasterio.crs import CRS  # noqa: E402
from rasterio.transform import Affine  # noqa: E402

import hsgds  # noqa: E402
from hsgds.preprocess.convert import ConvertOptions, convert  # noqa: E402
from hsgds.preprocess.readers import open_cube  # noqa: E402

UTM16N = CRS.from_epsg(32616)
ALBERS = CRS.from_proj4("+proj=aea +lat_1=29.5 +lat_2=45.5 +lat_0=23 +lon_0=-96 +x_0=0 +y_0=0 +ellps=GRS80 "
                        "+towgs84=0,0,0,0,0,0,0 +units=m +no_defs")


def gdal_view(path):
    """(crs, GDAL transform) as rasterio/GDAL reads ``path``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path) as ds:
            return ds.crs, ds.transform.to_gdal()


def stored_crs(geo):
    return CRS.from_wkt(geo["crs_wkt"]) if geo["crs_wkt"] else CRS.from_epsg(geo["epsg"]) if geo["epsg"] else None


def write_geotiff(path, cube, crs, transform, **extra):
    with rasterio.open(path, "w", driver="GTiff", height=cube.shape[1], width=cube.shape[2], count=cube.shape[0],
                       dtype=cube.dtype, crs=crs, transform=transform, **extra) as dst:
        dst.write(cube)
    return path


@pytest.fixture
def cube():
    return np.random.default_rng(0).integers(0, 1000, (5, 23, 31)).astype(np.int16)


@pytest.mark.parametrize("crs,transform", [
    (UTM16N, Affine(30.0, 0.0, 620000.5, 0.0, -20.0, 4000000.25)),
    (CRS.from_epsg(4326), Affine(0.001, 0.0, -86.5, 0.0, -0.001, 40.5)),
    (ALBERS, Affine(30.0, 0.0, 100.0, 0.0, -30.0, 200.0)),  # user-defined CRS: WKT through rasterio
    (UTM16N, Affine.translation(620000, 4000000) @ Affine.rotation(20) @ Affine.scale(30, -20)),  # ModelTransformation
    # a grid without a CRS: GDAL writes the transform tags without geokeys (the transform was dropped)
    (None, Affine(30.0, 0.0, 100.0, 0.0, -30.0, 200.0)),
    (None, Affine.translation(620000, 4000000) @ Affine.rotation(20) @ Affine.scale(30, -20)),
])
def test_geotiff_georeference_matches_gdal(tmp_path, cube, crs, transform):
    src = write_geotiff(tmp_path / "c.tif", cube, crs, transform)
    store = convert(src, tmp_path / "s.zarr", ConvertOptions())
    geo = hsgds.open_scene(store).meta.georeference
    ref_crs, ref_t = gdal_view(src)
    assert np.allclose(geo["transform"], ref_t, rtol=0, atol=1e-9)
    assert stored_crs(geo) == ref_crs


@pytest.mark.parametrize("crs,transform", [(UTM16N, Affine(30.0, 0.0, 620000.5, 0.0, -20.0, 4000000.25)),
                                           (ALBERS, Affine(30.0, 0.0, 100.0, 0.0, -30.0, 200.0)),  # WKT only
                                           (UTM16N, Affine.translation(620000, 4000000) @ Affine.rotation(20))])
def test_to_xarray_has_the_map_coordinates_rasterio_gives(tmp_path, cube, crs, transform):
    pytest.importorskip("xarray")
    src = write_geotiff(tmp_path / "c.tif", cube, crs, transform)
    da = hsgds.open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions())).to_xarray()
    ref = da.coords["spatial_ref"].attrs
    assert CRS.from_user_input(ref["spatial_ref"]) == crs
    assert np.allclose([float(v) for v in ref["GeoTransform"].split()], transform.to_gdal(), rtol=0, atol=1e-9)
    if transform.is_rectilinear:
        rows, cols = np.arange(cube.shape[1]), np.arange(cube.shape[2])
        xs, _ = rasterio.transform.xy(transform, np.zeros_like(cols), cols)  # pixel centres (offset="center")
        _, ys = rasterio.transform.xy(transform, rows, np.zeros_like(rows))
        np.testing.assert_allclose(da.x.values, xs, rtol=0, atol=1e-6)
        np.testing.assert_allclose(da.y.values, ys, rtol=0, atol=1e-6)
        assert da.sel(x=xs[3], y=ys[5]).values.tolist() == cube[:, 5, 3].tolist()
    else:
        assert "x" not in da.coords and "y" not in da.coords


def set_geokey(path, key, value):
    """Rewrite geokey ``key``'s value in place: the key directory is (key, location, count, value) quadruples."""
    import tifffile

    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags["GeoKeyDirectoryTag"]
        keys = list(tag.value)
        offset = tag.valueoffset
    i = [keys[j] for j in range(4, len(keys), 4)].index(key)
    keys[4 + 4 * i + 3] = value
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.asarray(keys, dtype="<u2").tobytes())


def test_geotiff_pixel_is_point_moves_origin_like_gdal(tmp_path, cube):
    src = write_geotiff(tmp_path / "p.tif", cube, UTM16N, Affine(30.0, 0.0, 620000.0, 0.0, -30.0, 4000000.0))
    set_geokey(src, 1025, 2)  # GTRasterTypeGeoKey: PixelIsPoint
    geo = open_cube(src).georeference
    _, ref_t = gdal_view(src)
    assert geo["transform"][0] == pytest.approx(620000.0 - 15.0) and np.allclose(geo["transform"], ref_t)


def test_an_epsg_code_proj_does_not_know_is_refused_by_convert(tmp_path, cube, run_cli):
    """A GeoTIFF whose ProjectedCSTypeGeoKey names a code in range that is no CRS (9999): the store recorded it,
    and a GeoTIFF map of it failed only once the whole scene was predicted. Now convert refuses it in one line
    naming the code and the source, and leaves nothing; `hsgds info SOURCE` says so beforehand."""
    src = write_geotiff(tmp_path / "c.tif", cube, UTM16N, Affine(30.0, 0.0, 620000.0, 0.0, -30.0, 4000000.0))
    set_geokey(src, 3072, 9999)  # ProjectedCSTypeGeoKey
    with pytest.raises(rasterio.errors.CRSError):  # PROJ, through rasterio, knows no EPSG:9999
        CRS.from_epsg(9999)
    code, _, err = run_cli("convert", src, "-o", tmp_path / "s.zarr")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{src} names its coordinate reference system EPSG:9999, which PROJ does not know (" in err, err
    assert "gdal_edit.py -a_srs EPSG:<code> c.tif" in err, err
    assert not (tmp_path / "s.zarr").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.tif"]
    code, out, _ = run_cli("info", src)
    assert code == 0 and "georef:     EPSG:9999; origin (620000, 4000000), pixel 30 x -30 (a code PROJ does not " \
                          "know: hsgds convert refuses it)" in out, out
    # a code PROJ knows converts as before
    set_geokey(src, 3072, 32617)
    assert hsgds.open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions())).meta.georeference["epsg"] == 32617


def test_without_rasterio_an_epsg_code_is_only_range_checked(tmp_path, cube, monkeypatch):
    """Without rasterio (hsgds[geo]) there is nothing to ask: the code is recorded when in range, as before."""
    src = write_geotiff(tmp_path / "c.tif", cube, UTM16N, Affine(30.0, 0.0, 620000.0, 0.0, -30.0, 4000000.0))
    set_geokey(src, 3072, 9999)
    monkeypatch.setitem(__import__("sys").modules, "rasterio", None)  # as if hsgds[geo] were not installed
    assert hsgds.open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions())).meta.georeference["epsg"] == 9999


def test_plain_tiff_has_no_georeference(tmp_path, cube):
    import tifffile

    tifffile.imwrite(tmp_path / "plain.tif", cube)
    assert open_cube(tmp_path / "plain.tif").georeference is None


@pytest.mark.parametrize("map_info,css,epsg", [
    (["UTM", "1.000", "1.000", "620000.5", "4000000.25", "30.0", "20.0", "16", "North", "WGS-84", "units=Meters"],
     None, 32616),
    (["UTM", "1", "1", "620000.5", "4000000.25", "30.0", "20.0", "16", "South", "WGS-84"], None, 32716),
    (["Geographic Lat/Lon", "1", "1", "-86.5", "40.5", "0.001", "0.001", "WGS-84", "units=Degrees"], None, 4326),
    (["UTM", "3.5", "2.0", "620000.5", "4000000.25", "30.0", "20.0", "16", "North", "WGS-84", "units=Meters",
      "rotation=30.0"], None, 32616),
    (["Albers Conical Equal Area", "1", "1", "100", "200", "30", "30", "North America 1983", "units=Meters"],
     CRS.from_epsg(5070).to_wkt(), None),
])
def test_envi_map_info_matches_gdal(tmp_path, map_info, css, epsg):
    data = np.random.default_rng(1).integers(0, 1000, (17, 19, 4)).astype(np.int16)
    md = {"map info": map_info}
    if css:
        md["coordinate system string"] = css
    envi.save_image(str(tmp_path / "e.hdr"), data, metadata=md, interleave="bil", ext=".img")
    store = convert(tmp_path / "e.hdr", tmp_path / "s.zarr", ConvertOptions())
    geo = hsgds.open_scene(store).meta.georeference
    ref_crs, ref_t = gdal_view(tmp_path / "e.img")
    assert np.allclose(geo["transform"], ref_t, rtol=0, atol=1e-9)
    assert geo["epsg"] == epsg
    assert stored_crs(geo) == ref_crs


@pytest.mark.parametrize("zone,datum", [(10, "North America 1983"), (23, "North America 1983"),
                                        (29, "North America 1983"), (14, "North America 1927"),
                                        (23, "North America 1927")])
def test_envi_nad_utm_zones_get_the_epsg_code_gdal_gives(tmp_path, zone, datum):
    """An ENVI UTM zone on NAD83 / NAD27 is named by its EPSG code where EPSG numbers that zone (NAD83 1-23, NAD27
    1-22), as GDAL names it. Past the last one, base + zone was another system (EPSG:26929 is NAD83 / Alabama
    East, a State Plane zone, 26723 NAD27 / Alabama East): there GDAL gives a UTM CRS without a code, and the store
    keeps the transform alone, as for any projection it names by no code."""
    data = np.random.default_rng(2).integers(0, 1000, (7, 6, 3)).astype(np.int16)
    map_info = ["UTM", "1", "1", "500000.0", "4100000.0", "30.0", "30.0", str(zone), "North", datum, "units=Meters"]
    envi.save_image(str(tmp_path / "e.hdr"), data, metadata={"map info": map_info}, interleave="bil", ext=".img")
    geo = hsgds.open_scene(convert(tmp_path / "e.hdr", tmp_path / "s.zarr", ConvertOptions())).meta.georeference
    ref_crs, ref_t = gdal_view(tmp_path / "e.img")
    assert geo["epsg"] == ref_crs.to_epsg() and geo["crs_wkt"] is None
    assert (geo["epsg"] is None) == (zone > {"North America 1983": 23, "North America 1927": 22}[datum])
    assert np.allclose(geo["transform"], ref_t, rtol=0, atol=1e-9)


@pytest.mark.parametrize("map_info,message", [
    (["UTM", "1", "1"], "needs at least 7"),
    (["UTM", "1", "1", "east", "4000000", "30", "30"], "must be numbers"),
    (["UTM", "1", "1", "0", "0", "0", "30"], "no usable transform"),
    (["UTM", "1", "1", "0", "0", "30", "30", "rotation=abc"], "rotation"),
])
def test_bad_envi_map_info_is_one_line(tmp_path, map_info, message):
    data = np.zeros((4, 5, 2), np.int16)
    envi.save_image(str(tmp_path / "e.hdr"), data, metadata={"map info": map_info}, ext=".img")
    with pytest.raises(hsgds.InputError, match=message):
        open_cube(tmp_path / "e.hdr")


def test_info_shows_georeference_and_old_stores_still_open(tmp_path, cube, run_cli):
    src = write_geotiff(tmp_path / "c.tif", cube, UTM16N, Affine(30.0, 0.0, 620000.5, 0.0, -20.0, 4000000.25))
    store = convert(src, tmp_path / "s.zarr", ConvertOptions())
    code, out, _ = run_cli("info", store)
    assert code == 0
    assert "georef:     EPSG:32616; origin (620000.5, 4000000.25), pixel 30 x -20" in out
    # a store written before the field existed (no key at all) opens with georeference None
    root = store / "zarr.json"
    meta = json.loads(root.read_text())
    del meta["attributes"]["hsgds"]["georeference"]
    root.write_text(json.dumps(meta))
    assert hsgds.open_scene(store).meta.georeference is None
    code, out, _ = run_cli("info", store)
    assert code == 0 and "georef:" not in out


@pytest.mark.parametrize("dtype,profile", [
    ("int16", {"compress": "lzw"}),  # GDAL's COG default
    ("uint16", {"compress": "lzw", "predictor": 2, "tiled": True, "blockxsize": 16, "blockysize": 16}),
    ("float32", {"compress": "zstd", "predictor": 3}),
    ("float32", {"compress": "deflate", "predictor": 3, "interleave": "band"}),
])
def test_compressed_geotiff_converts_to_the_same_store(tmp_path, run_cli, dtype, profile):
    """A GeoTIFF cube and label map compressed as GDAL writes them (which tifffile decodes with imagecodecs, in
    hsgds[geo]) convert with `hsgds convert`: zarr-python reads the tiles numpy cuts from the array written,
    the labels, and GDAL's georeference."""
    pytest.importorskip("imagecodecs")
    import zarr

    from tests.preprocess.test_convert import reference_tiles

    rng = np.random.default_rng(4)
    data = (rng.normal(0, 1000, (6, 37, 29)) if dtype == "float32" else rng.integers(0, 4000, (6, 37, 29)))
    data = data.astype(dtype)
    labels = rng.integers(0, 4, (1, 37, 29)).astype(np.uint8)
    transform = Affine(30.0, 0.0, 620000.0, 0.0, -30.0, 4000000.0)
    src = write_geotiff(tmp_path / "c.tif", data, UTM16N, transform, **profile)
    gt = write_geotiff(tmp_path / "gt.tif", labels, UTM16N, transform, compress="lzw")
    code, _, err = run_cli("convert", src, "--labels", gt, "-o", tmp_path / "s.zarr", "--max-patch", "5")
    assert code == 0, err
    scene = hsgds.open_scene(tmp_path / "s.zarr")
    g = zarr.open_group(tmp_path / "s.zarr", mode="r")
    np.testing.assert_array_equal(g["tiles"][...], reference_tiles(data.transpose(1, 2, 0), scene.grid.tile, 2,
                                                                   "reflect"))
    np.testing.assert_array_equal(g["labels"][...], labels[0])
    assert scene.dtype == np.dtype(dtype)
    geo = scene.meta.georeference
    assert stored_crs(geo) == UTM16N and geo["transform"] == list(transform.to_gdal())


def test_a_prisma_l2d_grid_that_does_not_fit_is_one_warning_line_and_no_georeference(tmp_path, run_cli):
    """A PRISMA L2D file whose lower-right corner does not lie where its cube's 30 m pixels put it: `hsgds convert`
    goes on with one warning line naming the distances, the store (read with zarr-python) records no
    georeference, `hsgds info SOURCE` says why, and convert-many returns the same line with the scene."""
    import zarr

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene
    from tests.sensors import PRISMA_UL, PRISMA_VNIR, write_prisma

    vnir = np.random.default_rng(2).integers(0, 1000, (9, 8, 4)).astype(np.uint16)
    src = write_prisma(tmp_path / "PRS_L2D_STD_0001.he5", vnir, vnir[..., :2], [800.0, 700.0, 600.0, 500.0],
                       [2000.0, 1500.0], grid={"Product_LRcorner_easting": PRISMA_UL[0] + 7 * 30 + 45})
    why = ("PRS_L2D_STD_0001.he5 (PRISMA L2D): its corner pixels' centres lie 255 m east and 240 m south of each "
           "other, where the cube's 9x8 pixels of 30 m span 210 m and 240 m")
    read = ("--key", PRISMA_VNIR, "--band-axis", "middle")
    code, out, err = run_cli("convert", src, *read, "-o", tmp_path / "p.zarr")
    said = [line for line in err.splitlines() if not line.startswith("hsgds: convert: ")]  # (progress: a log)
    assert code == 0 and said == [f"hsgds: warning: {why}; the store records no georeference (maps "
                                  "predicted from it carry no coordinates)"], err
    assert zarr.open_group(tmp_path / "p.zarr", mode="r").attrs["hsgds"]["georeference"] is None
    code, out, err = run_cli("info", src, *read)
    assert code == 0 and (f"georef:     not recorded: {why.split(': ', 1)[1]} (maps predicted from it carry no "
                          "coordinates)\n") in out, out + err
    out_dir = tmp_path / "many"
    out_dir.mkdir()
    result = convert_scene(ManifestRow(name="p", source=src, key=PRISMA_VNIR), out_dir,
                           ConvertOptions(band_axis="middle"))
    assert result.status == "converted" and result.warnings == (
        f"{why}; the store records no georeference (maps predicted from it carry no coordinates)",)


GRID = Affine(30.0, 0.0, 620000.0, 0.0, -30.0, 4000000.0)


@pytest.mark.parametrize("what,crs,transform,why", [
    ("shifted", UTM16N, Affine(30.0, 0.0, 623000.0, 0.0, -30.0, 4000000.0),
     r"pixel \(0, 0\) lies at \(623000, 4000000\) in it, at \(620000, 4000000\) in the cube"),
    ("finer", UTM16N, Affine(10.0, 0.0, 620000.0, 0.0, -10.0, 4000000.0),
     r"pixel \(31, 0\) lies at \(620310, 4000000\) in it, at \(620930, 4000000\) in the cube"),
    ("half a pixel off", UTM16N, Affine(30.0, 0.0, 620015.0, 0.0, -30.0, 4000000.0),
     r"pixel \(0, 0\) lies at \(620015, 4000000\) in it, at \(620000, 4000000\) in the cube"),
    ("another CRS", CRS.from_epsg(4326), Affine(0.001, 0.0, -86.5, 0.0, -0.001, 40.5),
     r"its CRS is EPSG:4326, the cube's EPSG:32616"),
])
def test_labels_on_another_map_grid_than_the_cube_are_refused(tmp_path, cube, run_cli, what, crs, transform, why):
    """A GeoTIFF ground truth of the cube's shape but on another map grid (a neighbouring scene's, another
    resolution, half a pixel off, another CRS) labels other ground: refused in one line, exit 2, nothing written.
    It used to be taken as the cube's, pixel for pixel, silently."""
    src = write_geotiff(tmp_path / "c.tif", cube, UTM16N, GRID)
    gt = np.random.default_rng(2).integers(0, 4, (1, *cube.shape[1:])).astype(np.uint8)
    labels = write_geotiff(tmp_path / "gt.tif", gt, crs, transform)
    code, _, err = run_cli("convert", src, "-o", tmp_path / "s.zarr", "--labels", labels)
    assert code == 2, (what, err)
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert re.search(rf"labels gt\.tif: its map grid is not the cube's \({why}\), so its pixels label other "
                     r"ground; resample it onto the cube's grid \(gdalwarp -r near -t_srs EPSG:32616 -tr 30 30 -te "
                     r"620000 3999310 620930 4000000 gt\.tif gt_on_cube\.tif\), or pass the one of this scene$",
                     line), line
    assert not (tmp_path / "s.zarr").exists()
    # a train mask is checked the same way
    write_geotiff(tmp_path / "gt_same.tif", gt, UTM16N, GRID)
    with pytest.raises(hsgds.InputError, match=rf"^train mask gt\.tif: its map grid is not the cube's \({why}\)"):
        convert(src, tmp_path / "m.zarr", ConvertOptions(labels=tmp_path / "gt_same.tif", split="masks",
                                                         train_mask=labels, test_mask=tmp_path / "gt_same.tif"))


def test_labels_on_the_cubes_grid_or_on_none_are_taken(tmp_path, cube):
    """Labels on the cube's grid (an ENVI ground truth whose map info GDAL reads as the GeoTIFF's grid, rounding
    in the last digit), and labels without a map grid (a plain TIFF, GDAL's default geotransform, a .npy) are
    the cube's pixels, as before."""
    src = write_geotiff(tmp_path / "c.tif", cube, UTM16N, GRID)
    gt = np.random.default_rng(3).integers(0, 4, cube.shape[1:]).astype(np.uint8)
    envi.save_image(str(tmp_path / "gt.hdr"), gt[:, :, None], ext=".img", metadata={
        "map info": ["UTM", "1", "1", "620000.0000001", "4000000", "30.0", "30.0", "16", "North", "WGS-84"]})
    assert gdal_view(tmp_path / "gt.img")[0] == UTM16N
    import tifffile

    tifffile.imwrite(tmp_path / "plain.tif", gt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rasterio's NotGeoreferencedWarning
        write_geotiff(tmp_path / "identity.tif", gt[None], None, Affine.identity())
    np.save(tmp_path / "gt.npy", gt)
    for name in ("gt.hdr", "plain.tif", "identity.tif", "gt.npy"):
        store = convert(src, tmp_path / f"{name}.zarr", ConvertOptions(labels=tmp_path / name))
        np.testing.assert_array_equal(hsgds.open_scene(store).labels, gt)


def test_labels_of_the_scene_at_another_resolution_are_told_how_to_fit(tmp_path, cube, run_cli):
    """The scene's ground truth on a finer grid (Houston 2018's is 0.5 m beside 1 m hyperspectral pixels) has
    another shape: the error gives both grids and the gdalwarp command that resamples it onto the cube's (it
    used to say "pass the ground truth of this scene"). Resampled as it says (rasterio's reproject, GDAL's
    warper), the labels convert."""
    from rasterio.transform import from_bounds
    from rasterio.warp import Resampling, reproject

    src = write_geotiff(tmp_path / "c.tif", cube, UTM16N, GRID)
    fine = np.random.default_rng(4).integers(0, 4, (1, 2 * cube.shape[1], 2 * cube.shape[2])).astype(np.uint8)
    write_geotiff(tmp_path / "gt.tif", fine, UTM16N, Affine(15.0, 0.0, 620000.0, 0.0, -15.0, 4000000.0))
    code, _, err = run_cli("convert", src, "-o", tmp_path / "s.zarr", "--labels", tmp_path / "gt.tif")
    assert code == 2 and not (tmp_path / "s.zarr").exists()
    found = re.fullmatch(r"hsgds: error: labels gt\.tif have shape \(46, 62\), but the cube is 23x31; its map grid has "
                         r"pixels of 15 x 15 from \(620000, 4000000\), the cube's 30 x 30 from \(620000, 4000000\): "
                         r"resample it onto the cube's grid \(gdalwarp -r near -t_srs EPSG:32616 -tr (\S+) (\S+) -te "
                         r"(\S+) (\S+) (\S+) (\S+) gt\.tif gt_on_cube\.tif\)\n", err)
    assert found, err
    dx, dy, xmin, ymin, xmax, ymax = (float(v) for v in found.groups())
    width, height = round((xmax - xmin) / dx), round((ymax - ymin) / dy)
    resampled = np.zeros((1, height, width), np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # (rasterio's own use of affine's * operator)
        target = from_bounds(xmin, ymin, xmax, ymax, width, height)
        reproject(fine, resampled, src_transform=Affine(15.0, 0.0, 620000.0, 0.0, -15.0, 4000000.0), src_crs=UTM16N,
                  dst_transform=target, dst_crs=UTM16N, resampling=Resampling.nearest)
        write_geotiff(tmp_path / "gt_on_cube.tif", resampled, UTM16N, target)
    store = convert(src, tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt_on_cube.tif"))
    np.testing.assert_array_equal(hsgds.open_scene(store).labels, resampled[0])


def test_convert_many_records_pixel_is_point_in_a_store_written_before_it_was_recorded(tmp_path, cube, run_cli):
    """A store of a PixelIsPoint GeoTIFF made before hsgds recorded it (its GeoTIFF maps PixelIsArea, half a pixel
    off the source where GDAL reads both under GTIFF_POINT_GEO_IGNORE=TRUE) holds the very tiles and georeference a
    conversion writes: convert-many rewrites its metadata alone, atomically, with the flag (no file of the store
    but its root zarr.json written again, the rest of that document as converted), says why in a line, and the
    collection lists it; one that records it is up to date; one whose georeference is not the source's is
    converted again, saying why."""
    pytest.importorskip("distributed")
    import zarr

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    src = tmp_path / "scene.tif"
    with rasterio.open(src, "w", driver="GTiff", height=cube.shape[1], width=cube.shape[2], count=cube.shape[0],
                       dtype=cube.dtype, crs=UTM16N, transform=Affine(30.0, 0.0, 620000.0, 0.0, -30.0, 4000000.0)) as dst:
        dst.update_tags(AREA_OR_POINT="Point")
        dst.write(cube)
    with rasterio.open(src) as ds:  # the source, as GDAL reads it: its coordinates name pixel centres
        assert ds.tags()["AREA_OR_POINT"] == "Point"
    row = ManifestRow(name="scene", source=src)
    out = tmp_path / "out"
    out.mkdir()
    store, opts = out / "scene.zarr", ConvertOptions(max_patch=3)
    assert convert_scene(row, out, opts).status == "converted"
    assert hsgds.open_scene(store).meta.pixel_is_point is True
    assert convert_scene(row, out, opts).status == "up to date"
    converted = json.loads((store / "zarr.json").read_text())
    older = json.loads(json.dumps(converted))
    del older["attributes"]["hsgds"]["pixel_is_point"]  # as an hsgds before it wrote the store
    (store / "zarr.json").write_text(json.dumps(older))
    assert zarr.open_group(store, mode="r").attrs["hsgds"].get("pixel_is_point") is None
    files = {p: (st.st_ino, st.st_mtime_ns, st.st_size) for p in store.rglob("*")
             if p.is_file() and p != store / "zarr.json" for st in [p.stat()]}
    assert [p.name for p in hsgds.open_scene(store).tile_paths] and set(hsgds.open_scene(store).tile_paths) < set(files)

    (tmp_path / "scenes.csv").write_text("source\nscene.tif\n")
    code, stdout, stderr = run_cli("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "3",
                                   "--workers", "1")
    assert code == 0, stderr
    assert ("scene: metadata updated (PixelIsPoint): the source's coordinates name pixel centres (PixelIsPoint), "
            "which the store did not record\n") in stdout
    assert "0 converted (0 tiles, 0.0 MB), 1 metadata updated (PixelIsPoint), 0 up to date, 0 failed of 1" in stdout
    assert {p: (st.st_ino, st.st_mtime_ns, st.st_size) for p in files for st in [p.stat()]} == files  # untouched
    assert zarr.open_group(store, mode="r").attrs["hsgds"]["pixel_is_point"] is True  # read by zarr-python
    assert json.loads((store / "zarr.json").read_text()) == converted  # all else as converted
    assert [p.name for p in store.glob(".zarr.json*")] == []  # no temporary left
    assert hsgds.open_scene(store).verify() == []
    assert hsgds.open_collection(out).entries[0].name == "scene"
    assert convert_scene(row, out, opts).status == "up to date"

    # a store of another georeference (not what this hsgds reads from the source): converted again, as before
    shifted = json.loads(json.dumps(older))
    shifted["attributes"]["hsgds"]["georeference"]["transform"][2] += 15.0
    (store / "zarr.json").write_text(json.dumps(shifted))
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == ("converted", "the source's coordinates name pixel centres "
                                                          "(PixelIsPoint), which the store does not record")
    assert json.loads((store / "zarr.json").read_text())["attributes"]["hsgds"]["georeference"] == \
        converted["attributes"]["hsgds"]["georeference"]
