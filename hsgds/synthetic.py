"""Seeded synthetic hyperspectral scenes with realistic structure, for tests and benchmarks.

Smooth endmember spectra are mixed per pixel with spatially coherent abundance maps; class regions
follow the dominant endmember; noise is added. Sizes like Pavia University (610x340x103) or an AVIRIS
flight line can be made without downloading anything.
"""

from __future__ import annotations

import numpy as np


def _smooth_field(rng: np.random.Generator, h: int, w: int, scale: int) -> np.ndarray:
    """A spatially coherent random field: coarse noise upsampled bilinearly."""
    gh, gw = max(2, h // scale + 2), max(2, w // scale + 2)
    coarse = rng.standard_normal((gh, gw))
    yi = np.linspace(0, gh - 1.001, h)
    xi = np.linspace(0, gw - 1.001, w)
    y0, x0 = yi.astype(int), xi.astype(int)
    fy, fx = (yi - y0)[:, None], (xi - x0)[None, :]
    c = coarse
    return ((1 - fy) * (1 - fx) * c[y0][:, x0] + (1 - fy) * fx * c[y0][:, x0 + 1]
            + fy * (1 - fx) * c[y0 + 1][:, x0] + fy * fx * c[y0 + 1][:, x0 + 1])


def make_scene(height: int, width: int, bands: int, *, classes: int = 8, dtype: str = "int16",
               seed: int = 0, labelled_fraction: float = 0.5, scale: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Return (cube (H, W, B) of ``dtype``, labels (H, W) uint8 with 0 = unlabelled).

    Integer dtypes hold reflectance scaled to 0..10000 (as AVIRIS / ROSIS products do); float dtypes
    hold reflectance in 0..1.
    """
    rng = np.random.default_rng(seed)
    wl = np.linspace(0.0, 1.0, bands)
    # endmember spectra: sums of a few broad Gaussian bumps (vegetation red edge, soil slope, water dips)
    ends = np.zeros((classes, bands))
    for k in range(classes):
        for _ in range(3):
            ends[k] += rng.uniform(0.1, 0.5) * np.exp(-((wl - rng.uniform(0, 1)) ** 2) / (2 * rng.uniform(0.02, 0.2) ** 2))
        ends[k] += rng.uniform(0.05, 0.2) + rng.uniform(-0.1, 0.1) * wl
    ends = np.clip(ends, 0.01, None)
    logits = np.stack([_smooth_field(rng, height, width, scale) for _ in range(classes)])
    abund = np.exp(3.0 * logits)
    abund /= abund.sum(axis=0, keepdims=True)
    cls = abund.argmax(axis=0)
    cube = np.empty((height, width, bands), dtype=np.float32)
    rows = max(1, (64 << 20) // max(1, width * bands * 4))  # mix in row blocks to bound memory
    for y in range(0, height, rows):
        a = abund[:, y:y + rows]
        cube[y:y + rows] = np.einsum("khw,kb->hwb", a, ends, optimize=True)
        cube[y:y + rows] += rng.normal(0, 0.005, size=cube[y:y + rows].shape).astype(np.float32)
    np.clip(cube, 0, 1, out=cube)
    field = _smooth_field(rng, height, width, max(1, scale // 2))
    keep = field > np.quantile(field, 1 - labelled_fraction) if labelled_fraction < 1 else True
    labels = np.where(keep, cls + 1, 0).astype(np.uint8)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return cube.astype(dt), labels
    return np.round(cube * 10000).astype(dt), labels
