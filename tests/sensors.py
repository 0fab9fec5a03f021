"""Two sensors' products written by hand for the tests, in their own layouts (independently of the converter's
readers): a PRISMA L2D HE5 file (h5py) and an EnMAP L2A / L1B GeoTIFF beside its METADATA.XML (tifffile, and
the XML as text)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import tifffile

#: where PRISMA L2D keeps its hyperspectral cubes, (rows, bands, columns)
PRISMA_FIELDS = "HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields"
PRISMA_VNIR, PRISMA_SWIR = f"{PRISMA_FIELDS}/VNIR_Cube", f"{PRISMA_FIELDS}/SWIR_Cube"


#: the map coordinates (EPSG:32632, UTM 32N) of the upper-left pixel's centre of the L2D files written here
PRISMA_EPSG, PRISMA_UL = 32632, (500015.0, 5000985.0)


def prisma_corners(height: int, width: int, ul: tuple[float, float] = PRISMA_UL, pixel: float = 30.0
                   ) -> dict[str, float]:
    """The corner root attributes of a PRISMA L2D grid of ``height`` x ``width`` ``pixel``-metre pixels whose
    upper-left pixel is centred at ``ul``: each corner pixel's centre, as ASI's products give them (EnMAP-Box's
    and prismaread's L2D importers put the grid's outer edge half a pixel beyond them)."""
    (x0, y0), x1, y1 = ul, ul[0] + (width - 1) * pixel, ul[1] - (height - 1) * pixel
    return {f"Product_{corner}corner_{axis}": value
            for corner, (x, y) in {"UL": (x0, y0), "UR": (x1, y0), "LL": (x0, y1), "LR": (x1, y1)}.items()
            for axis, value in (("easting", x), ("northing", y))}


def write_prisma(path: Path, vnir: np.ndarray, swir: np.ndarray, cw_vnir: list[float], cw_swir: list[float],
                 flags_vnir: list[int] | None = None, flags_swir: list[int] | None = None,
                 grid: dict[str, object] | None = None) -> Path:
    """A PRISMA L2D-shaped HE5 file: ``vnir`` and ``swir`` (H, W, B) stored as PRISMA does, (H, B, W) uint16,
    with the root attributes listing each detector's band centres (float32, nm, band i of the cube at element
    i), their flags (uint8, 1 = used; all 1 unless given) and FWHMs, the error matrix beside each cube, and the
    map grid: ``Epsg_Code`` (int32) and the corner pixels' centres (float64 easting / northing, see
    :func:`prisma_corners`, beside latitude / longitude corners); ``grid`` replaces those attributes (None: not
    written)."""
    attrs: dict[str, object] = {"Epsg_Code": np.int32(PRISMA_EPSG), **prisma_corners(*vnir.shape[:2])}
    attrs.update({"Product_ULcorner_lat": 45.14, "Product_ULcorner_long": 9.0,  # (not read: the grid is in metres)
                  "Product_LRcorner_lat": 45.13, "Product_LRcorner_long": 9.01})
    attrs.update(grid or {})
    with h5py.File(path, "w") as f:
        for name, cube in (("VNIR", vnir), ("SWIR", swir)):
            f[f"{PRISMA_FIELDS}/{name}_Cube"] = cube.transpose(0, 2, 1).astype(np.uint16)
            f[f"{PRISMA_FIELDS}/{name}_PIXEL_L2_ERR_MATRIX"] = np.zeros(cube.transpose(0, 2, 1).shape, np.uint8)
        f["HDFEOS/SWATHS/PRS_L2D_HCO/Geolocation Fields/Latitude"] = np.zeros(vnir.shape[:2], np.float32)
        for name, cw, flags in (("Vnir", cw_vnir, flags_vnir), ("Swir", cw_swir, flags_swir)):
            f.attrs[f"List_Cw_{name}"] = np.asarray(cw, np.float32)
            f.attrs[f"List_Cw_{name}_Flags"] = np.asarray([1] * len(cw) if flags is None else flags, np.uint8)
            f.attrs[f"List_Fwhm_{name}"] = np.where(np.asarray(cw) > 0, 12.5, 0).astype(np.float32)
        f.attrs["L2ScaleVnirMin"], f.attrs["L2ScaleVnirMax"] = np.float32(0), np.float32(1)
        for name, value in attrs.items():
            if value is not None:
                f.attrs[name] = value
    return path


#: an EnMAP product's name, before ``-SPECTRAL_IMAGE.TIF`` / ``-METADATA.XML``
ENMAP_L2A = "ENMAP01-____L2A-DT0000001867_20220724T104526Z_008_V010302_20230628T165614Z"
ENMAP_L1B = "ENMAP01-____L1B-DT0000001867_20220724T104526Z_008_V010302_20230628T165614Z"

#: the parts of an EnMAP METADATA.XML around its band list (abridged: the layout, not every field)
ENMAP_HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<level_X_product>
  <metadata>
    <schema><processingLevel>{level}</processingLevel></schema>
  </metadata>
  <product>
    <image><merge><channels>{bands}</channels></merge></image>
  </product>
  <specific>
    <numberOfBands>{bands}</numberOfBands>
    <numberOfVNIRBands>{vnir}</numberOfVNIRBands>
    <numberOfSWIRBands>{swir}</numberOfSWIRBands>
    <vnirProductQuality><expectedChannelsList>{vnir_list}</expectedChannelsList></vnirProductQuality>
    <swirProductQuality><expectedChannelsList>{swir_list}</expectedChannelsList></swirProductQuality>
    <bandCharacterisation>
"""
ENMAP_BAND = """      <bandID number="{number}">
        <wavelengthCenterOfBand>{centre}</wavelengthCenterOfBand>
        <FWHMOfBand>{fwhm}</FWHMOfBand>
        <GainOfBand>2.0E-5</GainOfBand>
        <OffsetOfBand>0</OffsetOfBand>
      </bandID>
"""
ENMAP_TAIL = """    </bandCharacterisation>
  </specific>
</level_X_product>
"""


def enmap_xml(centres: list[str], vnir: int | None = None, level: str = "L2A") -> str:
    """The text of an EnMAP METADATA.XML listing ``centres`` (as written, nm) for bands 1.., the first ``vnir``
    of them VNIR's (default: those before the first at or above 1000 nm)."""
    if vnir is None:
        vnir = next((i for i, c in enumerate(centres) if c.replace(".", "", 1).isdigit() and float(c) >= 1000),
                    len(centres))
    numbers = list(range(1, len(centres) + 1))
    head = ENMAP_HEAD.format(level=level, bands=len(centres), vnir=vnir, swir=len(centres) - vnir,
                             vnir_list=",".join(map(str, numbers[:vnir])), swir_list=",".join(map(str, numbers[vnir:])))
    return head + "".join(ENMAP_BAND.format(number=n, centre=c, fwhm=6.5) for n, c in zip(numbers, centres)) + ENMAP_TAIL


def write_enmap(folder: Path, cube: np.ndarray, xml: str | None, name: str = ENMAP_L2A, image: str = "SPECTRAL_IMAGE",
                xml_ext: str = ".XML") -> Path:
    """``cube`` (H, W, B) as an EnMAP image GeoTIFF, band-sequential int16 pages as EnMAP's (no GDAL wavelength
    metadata), named ``{name}-{image}.TIF``, beside ``{name}-METADATA{xml_ext}`` holding ``xml`` (none when
    None); returns the image's path."""
    path = folder / f"{name}-{image}.TIF"
    tifffile.imwrite(path, cube.transpose(2, 0, 1).astype(np.int16), photometric="minisblack")
    if xml is not None:
        (folder / f"{name}-METADATA{xml_ext}").write_text(xml)
    return path
