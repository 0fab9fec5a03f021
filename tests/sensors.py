"""Sensors' products written by hand for the tests, in their own layouts (independently of the converter's
readers): a PRISMA L2D HE5 file (h5py)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

#: where PRISMA L2D keeps its hyperspectral cubes, (rows, bands, columns)
PRISMA_FIELDS = "HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields"
PRISMA_VNIR, PRISMA_SWIR = f"{PRISMA_FIELDS}/VNIR_Cube", f"{PRISMA_FIELDS}/SWIR_Cube"


def write_prisma(path: Path, vnir: np.ndarray, swir: np.ndarray, cw_vnir: list[float], cw_swir: list[float],
                 flags_vnir: list[int] | None = None, flags_swir: list[int] | None = None) -> Path:
    """A PRISMA L2D-shaped HE5 file: ``vnir`` and ``swir`` (H, W, B) stored as PRISMA does, (H, B, W) uint16,
    with the root attributes listing each detector's band centres (float32, nm, band i of the cube at element
    i), their flags (uint8, 1 = used; all 1 unless given) and FWHMs, and the error matrix beside each cube."""
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
        f.attrs["Epsg_Code"] = np.int32(32632)
    return path
