"""ENVI scenes written by hand for the tests (independently of SPy and of the converter's reader)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_envi(path: Path, cube: np.ndarray, wavelengths: list[float] | None = None, interleave: str = "bip") -> Path:
    """``cube`` (H, W, B) as little-endian int16 ENVI, band-interleaved-by-pixel or band-sequential, with its
    wavelengths (nm) when given; returns the header's path."""
    h, w, b = cube.shape
    data = {"bip": cube, "bsq": cube.transpose(2, 0, 1)}[interleave]
    path.with_suffix(".img").write_bytes(np.ascontiguousarray(data).astype("<i2").tobytes())
    fields = [f"samples = {w}", f"lines = {h}", f"bands = {b}", "header offset = 0", "file type = ENVI Standard",
              "data type = 2", f"interleave = {interleave}", "byte order = 0"]
    if wavelengths is not None:
        fields += ["wavelength units = Nanometers", "wavelength = {" + ", ".join(f"{v:g}" for v in wavelengths) + "}"]
    hdr = path.with_suffix(".hdr")
    hdr.write_text("ENVI\n" + "\n".join(fields) + "\n")
    return hdr


def write_envi_labels(path: Path, labels: np.ndarray, fields: tuple[str, ...] = ()) -> Path:
    """``labels`` (H, W) as a uint8 ENVI Classification: ``path`` (the header) and its ``.img`` binary, with
    ``fields`` as extra header lines (e.g. ``data ignore value = 3``); returns the header's path."""
    h, w = labels.shape
    path.with_suffix(".img").write_bytes(np.ascontiguousarray(labels).astype(np.uint8).tobytes())
    lines = ["ENVI", f"samples = {w}", f"lines = {h}", "bands = 1", "header offset = 0",
             "file type = ENVI Classification", "data type = 1", "interleave = bsq", "byte order = 0", *fields]
    path.write_text("\n".join(lines) + "\n")
    return path
