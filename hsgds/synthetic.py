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
            amplitude, centre = rng.uniform(0.1, 0.5), rng.uniform(0, 1)
            ends[k] += amplitude * np.exp(-((wl - centre) ** 2) / (2 * rng.uniform(0.02, 0.2) ** 2))
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


def pavia_like_labels(height: int = 305, width: int = 170, *, seed: int = 0) -> np.ndarray:
    """A seeded urban ground truth shaped like Pavia University's: elongated classes and small buildings.

    Returns an (H, W) uint8 map with 0 = unlabelled and 9 classes: 1 asphalt (long roads, 5-8 px wide),
    2 meadows (large smooth regions), 3 gravel (diagonal strips), 4 trees (rows along the roads),
    5 painted metal sheets, 6 bare soil, 7 bitumen, 8 bricks (rectangular roofs), 9 shadows (thin strips
    beside the roofs). About a third of the pixels are labelled (a fifth in the real scene). Used to test
    spatial splits on classes that are long and thin rather than compact.
    """
    rng = np.random.default_rng(seed)
    lab = np.zeros((height, width), dtype=np.uint8)
    field = _smooth_field(rng, height, width, max(8, min(height, width) // 4))
    lab[field > np.quantile(field, 0.9)] = 2  # meadows
    lab[field < np.quantile(field, 0.04)] = 6  # bare soil
    for _ in range(max(2, height // 60)):  # horizontal roads with tree rows beside them
        y, wd = int(rng.integers(0, height - 8)), int(rng.integers(5, 9))
        x0, x1 = sorted(int(v) for v in rng.integers(0, width, 2))
        x0, x1 = min(x0, width // 4), max(x1, 3 * width // 4)
        lab[y:y + wd, x0:x1] = 1
        ty = y + wd + 2
        if ty + 3 < height:
            lab[ty:ty + 3, x0 + 10:x1 - 10] = 4
    for _ in range(max(2, width // 60)):  # vertical roads
        x, wd = int(rng.integers(0, width - 8)), int(rng.integers(5, 9))
        lab[height // 10:9 * height // 10, x:x + wd] = 1
    for _ in range(3):  # gravel: diagonal strips
        y0, x0 = int(rng.integers(0, height)), int(rng.integers(0, width))
        length, slope = int(rng.integers(40, 90)), rng.choice([-1, 1])
        for t in range(length):
            y, x = y0 + t, x0 + slope * (t // 2)
            if 0 <= y < height and 0 <= x < width - 5:
                lab[y, x:x + 5] = 3
    for cls, n in ((5, 3), (7, 4), (8, 8)):  # roofs; shadows on their south side
        for _ in range(n):
            hh, ww = (int(v) for v in rng.integers(8, 28, 2))
            y, x = int(rng.integers(0, height - hh - 4)), int(rng.integers(0, width - ww))
            lab[y:y + hh, x:x + ww] = cls
            lab[y + hh:y + hh + 3, x:x + ww] = 9
    return lab
