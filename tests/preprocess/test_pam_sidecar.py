"""GDAL's PAM sidecar ``<raster>.aux.xml`` (what GDAL writes beside a raster whose format cannot hold what was set on
it: ``gdal_edit.py``, SetMetadata / SetScale / SetNoDataValue on a read-only GeoTIFF or an ENVI file) is read as GDAL
reads it, after the format's own metadata, its items replacing those. Each sidecar here is written by hand in
GDAL's format; rasterio (GDAL itself) reading the same files is the reference for what the cube must hold."""

from __future__ import annotations

import math
import warnings
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import tifffile

from hsgds.errors import InputError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.preprocess.readers import open_cube
from hsgds.preprocess.readers.base import recorded_nodata
from hsgds.scene import open_scene

H, W, B = 9, 7, 4
TO_NM = {"nm": 1.0, "nanometers": 1.0, "micrometers": 1000.0}


def pam_xml(dataset: dict[str, str] | None = None, bands: dict[int, dict[str, str]] | None = None,
            imagery: dict[int, dict[str, str]] | None = None) -> str:
    """A PAM file as GDAL writes it: dataset ``<Metadata>`` items, then per band (numbered from 1) its
    ``Description``, ``NoDataValue``, ``Offset``, ``Scale`` elements and ``<Metadata>`` items (keys given in lower
    case are items; the four element names are elements), and IMAGERY-domain items."""
    out = ["<PAMDataset>"]
    if dataset:
        out += ["  <Metadata>", *(f'    <MDI key="{k}">{v}</MDI>' for k, v in dataset.items()), "  </Metadata>"]
    for band in sorted(set(bands or {}) | set(imagery or {})):
        given = (bands or {}).get(band, {})
        out.append(f'  <PAMRasterBand band="{band}">')
        out += [f"    <{k}>{v}</{k}>" for k, v in given.items() if k in ("Description", "NoDataValue", "Offset", "Scale")]
        items = {k: v for k, v in given.items() if k[0].islower()}
        if items:
            out += ["    <Metadata>", *(f'      <MDI key="{k}">{v}</MDI>' for k, v in items.items()), "    </Metadata>"]
        if (imagery or {}).get(band):
            out += ['    <Metadata domain="IMAGERY">',
                    *(f'      <MDI key="{k}">{v}</MDI>' for k, v in imagery[band].items()), "    </Metadata>"]
        out.append("  </PAMRasterBand>")
    return "\n".join([*out, "</PAMDataset>", ""])


def raw_cube(seed: int) -> np.ndarray:
    """(H, W, B) int16 reflectance counts, one pixel at -9999 in every band."""
    raw = np.random.default_rng(seed).integers(0, 10000, (H, W, B)).astype(np.int16)
    raw[2, 3, :] = -9999
    return raw


def gdal_view(path: Path) -> dict:
    """What GDAL reads of ``path`` (with its PAM sidecar): each band's metadata items (default and IMAGERY domains),
    description, scale, offset and nodata value, the dataset's items, and the unscaled values."""
    rasterio = pytest.importorskip("rasterio")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NotGeoreferencedWarning
        with rasterio.open(path) as ds:
            return {"tags": [ds.tags(b) for b in ds.indexes], "imagery": [ds.tags(b, ns="IMAGERY") for b in ds.indexes],
                    "dataset": ds.tags(), "descriptions": list(ds.descriptions), "scales": list(ds.scales),
                    "offsets": list(ds.offsets), "nodata": list(ds.nodatavals),
                    "values": (ds.read().astype(np.float64).transpose(1, 2, 0) * np.asarray(ds.scales)
                               + np.asarray(ds.offsets)).astype(np.float32)}


def nm_of(view: dict) -> list[float]:
    """Band centres in nm from GDAL's items as rasterio gives them: each band's wavelength in its units (the
    dataset's when the band has none), else CENTRAL_WAVELENGTH_UM."""
    out = []
    for tags, imagery in zip(view["tags"], view["imagery"]):
        if "wavelength" in tags:
            units = tags.get("wavelength_units", view["dataset"].get("wavelength_units", "nm"))
            out.append(float(tags["wavelength"]) * TO_NM[units.lower()])
        else:
            out.append(float(imagery["CENTRAL_WAVELENGTH_UM"]) * 1000)
    return out


@pytest.mark.parametrize("keys", ["wavelength", "CENTRAL_WAVELENGTH_UM"])
def test_a_tiff_takes_band_centres_names_scales_nodata_and_bad_bands_from_its_pam_sidecar(tmp_path, run_cli, keys):
    """A TIFF without GDAL metadata of its own (as tifffile writes it) and GDAL's sidecar beside it giving every band
    a centre (``wavelength`` in ``wavelength_units``, or GDAL's standard ``CENTRAL_WAVELENGTH_UM`` in the IMAGERY
    domain), a description, a scale and offset and a nodata value, and the dataset a bad band list: the store holds
    what GDAL reads (they used to be lost, the values stored raw), the sidecar is part of its source and `hsgds
    info` says where the band centres and the nodata value come from."""
    raw = raw_cube(1)
    src = tmp_path / "scene.tif"
    tifffile.imwrite(src, raw, photometric="minisblack", planarconfig="contig")
    um = [0.45, 0.55, 0.65, 0.85]
    bands = {b + 1: {"Description": f"band {b + 1} ({um[b]} um)", "NoDataValue": "-9999", "Offset": "0",
                     "Scale": "0.0001"} for b in range(B)}
    if keys == "wavelength":
        for b in range(B):
            bands[b + 1].update(wavelength=str(um[b]), wavelength_units="Micrometers")
        imagery = None
    else:
        imagery = {b + 1: {"CENTRAL_WAVELENGTH_UM": str(um[b]), "FWHM_UM": "0.01"} for b in range(B)}
    (tmp_path / "scene.tif.aux.xml").write_text(pam_xml({"bbl": "{1, 0, 1, 1}"}, bands, imagery))
    gdal = gdal_view(src)
    if keys == "wavelength":
        assert [t["wavelength"] for t in gdal["tags"]] == [str(v) for v in um]
    else:
        assert [t["CENTRAL_WAVELENGTH_UM"] for t in gdal["imagery"]] == [str(v) for v in um]
    assert gdal["scales"] == [1e-4] * B and gdal["nodata"] == [-9999] * B and gdal["dataset"]["bbl"] == "{1, 0, 1, 1}"

    scene = open_scene(convert(src, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.wavelengths == pytest.approx(nm_of(gdal)) and scene.wavelengths == pytest.approx([450, 550, 650, 850])
    assert scene.band_names == gdal["descriptions"]
    assert scene.bad_bands == [1]
    assert scene.meta.source["files"] == ["scene.tif", "scene.tif.aux.xml"]
    assert scene.meta.nodata["value"] == np.float32(-9999 * 1e-4) and scene.meta.nodata["pixels"] == 1
    np.testing.assert_array_equal(scene.read(0, H, 0, W), gdal["values"])
    code, out, _ = run_cli("info", src)
    assert code == 0
    assert "bands:      4 bands, 450.0-850.0 nm (from scene.tif.aux.xml)" in out
    assert "-0.9999 (NoDataValue in scene.tif.aux.xml)" in out


def test_pam_items_replace_the_tiffs_own_band_by_band(tmp_path):
    """A GeoTIFF whose GDAL metadata tag gives every band a centre, a description and a scale, and a nodata tag;
    its sidecar replaces band 2's centre, band 3's description, band 4's scale and every band's nodata value: the
    cube holds GDAL's merge (each sidecar item over the tag's, the tag's elsewhere), not the tag's alone."""
    rasterio = pytest.importorskip("rasterio")
    raw = raw_cube(2)
    raw[4, 4, :] = -1
    src = tmp_path / "scene.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(src, "w", driver="GTiff", height=H, width=W, count=B, dtype="int16", nodata=-9999) as ds:
            ds.write(raw.transpose(2, 0, 1))
            ds.scales, ds.offsets = (1e-4,) * B, (0.0,) * B
            for b in range(B):
                ds.update_tags(b + 1, wavelength=str(400 + 100 * b), wavelength_units="nm")
                ds.set_band_description(b + 1, f"tag {b + 1}")
    with closing(open_cube(src)) as cube:  # the tag's alone
        assert (cube.wavelengths, cube.band_names, cube.nodata) == (
            [400, 500, 600, 700], ["tag 1", "tag 2", "tag 3", "tag 4"], np.float32(-0.9999))
    (tmp_path / "scene.tif.aux.xml").write_text(pam_xml(bands={
        1: {"NoDataValue": "-1"}, 2: {"NoDataValue": "-1", "wavelength": "555"},
        3: {"NoDataValue": "-1", "Description": "pam 3"}, 4: {"NoDataValue": "-1", "Scale": "0.0002"}}))
    gdal = gdal_view(src)
    assert nm_of(gdal) == [400, 555, 600, 700] and gdal["descriptions"] == ["tag 1", "tag 2", "pam 3", "tag 4"]
    assert gdal["scales"] == [1e-4, 1e-4, 1e-4, 2e-4] and gdal["nodata"] == [-1] * B
    with closing(open_cube(src)) as cube:
        assert cube.wavelengths == nm_of(gdal) and cube.band_names == gdal["descriptions"]
        assert cube.files == [src, tmp_path / "scene.tif.aux.xml"]
        values = cube.read(0, H, 0, W)
        assert math.isnan(recorded_nodata(cube))  # -1 unscaled differs by band: a pixel at it in every band is NaN
        assert np.isnan(values[4, 4]).all()
        keep = np.ones((H, W), bool)
        keep[4, 4] = False
        np.testing.assert_array_equal(values[keep], gdal["values"][keep])


def write_envi(stem: Path, raw: np.ndarray) -> Path:
    """``stem``.img (bsq int16) and the header with band centres, names, gains, a data ignore value and a bbl."""
    raw.transpose(2, 0, 1).astype("<i2").tofile(stem.with_suffix(".img"))
    stem.with_suffix(".hdr").write_text(
        f"ENVI\nsamples = {W}\nlines = {H}\nbands = {B}\nheader offset = 0\ndata type = 2\ninterleave = bsq\n"
        "byte order = 0\nwavelength units = Nanometers\nwavelength = {400, 500, 600, 700}\n"
        "band names = {hdr 1, hdr 2, hdr 3, hdr 4}\ndata gain values = {0.0001, 0.0001, 0.0001, 0.0001}\n"
        "data ignore value = -9999\nbbl = {1, 1, 1, 0}\n")
    return stem.with_suffix(".hdr")


def test_an_envi_file_takes_what_its_pam_sidecar_sets_over_its_header(tmp_path):
    """GDAL reads the PAM sidecar of an ENVI file (``<binary>.aux.xml``) after its header, each item replacing the
    header's: band 1's centre, band 2's name, band 3's scale and the bad band list come from the sidecar, the rest
    from the header, as GDAL reads them; the sidecar is part of the source."""
    raw = raw_cube(3)
    header = write_envi(tmp_path / "scene", raw)
    binary, pam = tmp_path / "scene.img", tmp_path / "scene.img.aux.xml"
    with closing(open_cube(header)) as cube:  # the header's alone
        assert (cube.wavelengths, cube.bad_bands, cube.files) == ([400, 500, 600, 700], [3], [binary, header])
    pam.write_text(pam_xml({"bbl": "{0, 1, 1, 1}"}, {1: {"wavelength": "450"}, 2: {"Description": "pam 2"},
                                                    3: {"Scale": "0.0002"}}))
    gdal = gdal_view(binary)
    assert nm_of(gdal) == [450, 500, 600, 700] and gdal["descriptions"][1] == "pam 2"
    assert gdal["scales"] == [1e-4, 1e-4, 2e-4, 1e-4] and gdal["dataset"]["bbl"] == "{0, 1, 1, 1}"
    with closing(open_cube(header)) as cube:
        assert cube.wavelengths == nm_of(gdal) and cube.wavelengths_file == pam
        assert cube.band_names == ["hdr 1", "pam 2", "hdr 3", "hdr 4"]  # (GDAL's others add "(400 Nanometers)")
        assert cube.bad_bands == [0] and cube.files == [binary, header, pam]
        values = cube.read(0, H, 0, W)
        keep = np.ones((H, W), bool)
        keep[2, 3] = False  # the nodata pixel: NaN, as the bands' scales differ
        np.testing.assert_array_equal(values[keep], gdal["values"][keep])
        assert np.isnan(values[2, 3]).all()
    scene = open_scene(convert(binary, tmp_path / "s.zarr", ConvertOptions(max_patch=3)))
    assert scene.wavelengths == [450, 500, 600, 700] and scene.bad_bands == [0]
    assert scene.meta.source["files"] == ["scene.img", "scene.hdr", "scene.img.aux.xml"]


@pytest.mark.parametrize(("text", "message"), [
    ('<PAMDataset>\n  <PAMRasterBand band="1">\n    <Scale>0.0001</Scale>\n',
     r"scene\.tif\.aux\.xml is not well-formed XML \(no element found: line 4, column 0\), so what it sets on "
     r"scene\.tif cannot be read; fix it or remove it \(GDAL keeps a raster's metadata there when the raster itself "
     r"cannot hold it\)"),
    ("<GDALMetadata/>", r"scene\.tif\.aux\.xml is no GDAL PAM file \(its root element is <GDALMetadata>, not "
                        r"<PAMDataset>\); fix it or remove it"),
    (pam_xml(bands={5: {"wavelength": "900"}}),
     r"scene\.tif\.aux\.xml describes band 5, but scene\.tif has 4 bands \(1 to 4\): it belongs to another raster "
     r"or is damaged; remove it, or fix its PAMRasterBand numbers"),
    ('<PAMDataset><PAMRasterBand band="2"/><PAMRasterBand band="2"/></PAMDataset>',
     r"scene\.tif\.aux\.xml describes band 2 twice \(two PAMRasterBand elements\): it is damaged; fix it or "
     r"remove it"),
])
def test_a_sidecar_that_is_no_pam_file_or_of_another_band_count_is_refused(tmp_path, run_cli, text, message):
    """A sidecar that is no XML, no PAM file, or names a band the raster does not have (a sidecar of another
    raster, left behind) is named in one line, before any work: `hsgds convert` exits 2 and writes no store (GDAL
    would ignore it, or part of it, and the store would lack what it sets without a word)."""
    src = tmp_path / "scene.tif"
    tifffile.imwrite(src, raw_cube(4), photometric="minisblack", planarconfig="contig")
    (tmp_path / "scene.tif.aux.xml").write_text(text)
    with pytest.raises(InputError, match=f"^{tmp_path}/" + message):
        open_cube(src)
    code, out, err = run_cli("convert", src, "-o", tmp_path / "s.zarr")
    assert code == 2 and err.startswith("hsgds: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "s.zarr").exists()


def test_bands_left_with_different_nodata_values_are_refused_when_used(tmp_path, run_cli):
    """A sidecar giving band 1 another nodata value than the tag's for the others: GDAL reads one per band, a store
    records one for all, so the value is refused where it is used (as one that is no number), `--nodata` overriding
    it."""
    src = tmp_path / "scene.tif"
    tifffile.imwrite(src, raw_cube(5), photometric="minisblack", planarconfig="contig",
                     extratags=[(42113, "s", 0, "-9999", True)])  # GDAL_NODATA
    (tmp_path / "scene.tif.aux.xml").write_text(pam_xml(bands={1: {"NoDataValue": "0"}}))
    assert gdal_view(src)["nodata"] == [0, -9999, -9999, -9999]
    message = ("scene.tif with scene.tif.aux.xml: its bands' nodata values differ (band 1: 0, band 2: -9999, band 3: "
               "-9999, band 4: -9999); hsgds records one for all bands: give every band the same (gdal_edit.py "
               "-a_nodata VALUE), or override it with --nodata VALUE (or --nodata none)")
    with closing(open_cube(src)) as cube, pytest.raises(InputError) as refused:
        recorded_nodata(cube)
    assert str(refused.value) == message
    code, _, err = run_cli("convert", src, "-o", tmp_path / "s.zarr")
    assert (code, err) == (2, f"hsgds: error: {message}\n")
    code, _, _ = run_cli("convert", src, "-o", tmp_path / "s.zarr", "--nodata", "-9999")
    assert code == 0 and open_scene(tmp_path / "s.zarr").meta.nodata["pixels"] == 1


def test_no_sidecar_or_one_of_statistics_only_changes_nothing(tmp_path):
    """Without a sidecar the cube is the TIFF's alone; GDAL's statistics sidecar (what `gdalinfo -stats` leaves
    beside a read-only file: STATISTICS_* items only) sets nothing hsgds reads, so it is no part of the source."""
    rasterio = pytest.importorskip("rasterio")
    raw = raw_cube(6)
    src = tmp_path / "scene.tif"
    md = "".join(f'<Item name="wavelength" sample="{b}">{400 + 100 * b}</Item>' for b in range(B))
    tifffile.imwrite(src, raw, photometric="minisblack", planarconfig="contig",
                     extratags=[(42112, "s", 0, f"<GDALMetadata>{md}</GDALMetadata>", True)])

    def read() -> tuple:
        with closing(open_cube(src)) as cube:
            return (cube.files, cube.wavelengths, cube.wavelengths_file, cube.band_names, cube.nodata, cube.bad_bands,
                    cube.read(0, H, 0, W))

    files, nm, nm_file, names, nodata, bad, values = read()
    assert (files, nm, nm_file, names, nodata, bad) == ([src], [400, 500, 600, 700], None, None, None, None)
    np.testing.assert_array_equal(values, raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NotGeoreferencedWarning
        with rasterio.open(src) as ds:
            ds.statistics(1, approx=False)  # GDAL keeps them in the PAM sidecar of a read-only file
    assert "STATISTICS_MEAN" in (tmp_path / "scene.tif.aux.xml").read_text()
    again = read()
    assert again[:-1] == (files, nm, nm_file, names, nodata, bad)
    np.testing.assert_array_equal(again[-1], raw)


def test_a_sidecar_over_a_gdal_metadata_tag_that_is_no_xml_is_refused(tmp_path):
    """What a sidecar replaces of a GDAL metadata tag that is no XML cannot be known (the tag's scales for the other
    bands would be lost without a word): refused in one line; without the sidecar the tag is named as before."""
    src = tmp_path / "scene.tif"
    tifffile.imwrite(src, raw_cube(7), photometric="minisblack", planarconfig="contig",
                     extratags=[(42112, "s", 0, '<GDALMetadata><Item name="wavelength" sample="0">4', True)])
    with closing(open_cube(src)) as cube:
        assert cube.wavelengths_note == "scene.tif: its GDAL_METADATA tag is not XML, so its wavelengths are unreadable"
    (tmp_path / "scene.tif.aux.xml").write_text(pam_xml(bands={1: {"Scale": "0.0001"}}))
    with pytest.raises(InputError, match=r"^scene\.tif: its GDAL_METADATA tag is not XML, so what scene\.tif\.aux\.xml "
                                         r"beside it changes of it cannot be known; fix the tag, or remove "
                                         r"scene\.tif\.aux\.xml$"):
        open_cube(src)
