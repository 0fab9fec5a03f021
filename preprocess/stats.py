"""Per-band statistics accumulated tile by tile (Chan et al.'s parallel mean/variance), in float64."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hsgds.errors import InputError


@dataclass
class BandAccumulator:
    """Running count, mean, sum of squared deviations (M2), min and max per band.

    Partial results are merged in a fixed order, so the result does not depend on which thread
    finished first.
    """

    bands: int
    count: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    min: np.ndarray | None = None
    max: np.ndarray | None = None

    @classmethod
    def of(cls, pixels: np.ndarray, block: int = 2048) -> BandAccumulator:
        """Statistics of an (N, B) array of pixels, in blocks so float64 temporaries stay small."""
        acc = cls(bands=pixels.shape[-1])
        with np.errstate(over="ignore", invalid="ignore"):  # overflow shows as inf/NaN: check_finite names it
            for i in range(0, len(pixels), block):
                x = pixels[i:i + block].astype(np.float64)
                part = cls(bands=acc.bands, count=len(x), mean=x.mean(axis=0))
                part.m2 = ((x - part.mean) ** 2).sum(axis=0)
                part.min, part.max = x.min(axis=0), x.max(axis=0)
                acc.merge(part)
        return acc

    def merge(self, other: BandAccumulator) -> None:
        if other.count == 0:
            return
        if self.count == 0:
            self.count, self.mean, self.m2, self.min, self.max = (
                other.count, other.mean, other.m2, other.min, other.max)
            return
        n = self.count + other.count
        with np.errstate(over="ignore", invalid="ignore"):  # see of()
            delta = other.mean - self.mean
            self.mean = self.mean + delta * (other.count / n)
            self.m2 = self.m2 + other.m2 + delta ** 2 * (self.count * other.count / n)
        self.min = np.minimum(self.min, other.min)
        self.max = np.maximum(self.max, other.max)
        self.count = n

    def result(self) -> dict[str, np.ndarray] | None:
        """mean, population std, min, max (float64), or None when no pixel was seen."""
        if self.count == 0:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            std = np.sqrt(self.m2 / self.count)
        # a band of one value: its running mean and M2 carry float64 rounding (a std of 2e-13 about a float64
        # band's 608.6395...), which z-scoring divides by, blowing the rounding up into an arbitrary value where
        # a constant band is meant to read 0; its mean is that value and its std 0
        constant = self.min == self.max
        return {"mean": np.where(constant, self.min, self.mean), "std": np.where(constant, 0.0, std), "min": self.min,
                "max": self.max}


def check_finite(stats: dict[str, np.ndarray], pixels: str, fix: str) -> None:
    """Refuse statistics that overflowed float64 (values near 1e154 and above): a loader would normalize
    with them into NaN patches. ``pixels`` says whose statistics they are, ``fix`` what to do."""
    for name in ("mean", "std", "min", "max"):
        bad = np.flatnonzero(~np.isfinite(stats[name]))
        if bad.size:
            b = int(bad[0])
            largest = float(np.maximum(np.abs(stats["min"][b]), np.abs(stats["max"][b])))
            raise InputError(f"band {b}: the {name} of the {pixels} pixels is {stats[name][b]} (values up to "
                             f"{largest:.3g} are too large for float64 band statistics); {fix}")
