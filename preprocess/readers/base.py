"""The source-cube interface every reader returns, and one implementation over any sliceable array."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hsgds.errors import InputError

#: dtypes a store can hold (native dtype is kept; casting happens at training time).
SUPPORTED_DTYPES = tuple(
    np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                          "float32", "float64")
)


def check_dtype(dtype: Any, what: str) -> np.dtype:
    """Return the native-endian form of ``dtype`` or raise InputError if stores cannot hold it."""
    dt = np.dtype(dtype)
    native = dt.newbyteorder("=")
    if native not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise InputError(f"{what} has unsupported dtype {dt} (supported: {names})")
    return native


class SourceCube(Protocol):
    """A hyperspectral cube as the converter sees it: (H, W, B), read in windows."""

    shape: tuple[int, int, int]
    dtype: np.dtype
    wavelengths: list[float] | None
    band_names: list[str] | None
    files: list[Path]

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Return rows y0:y1, columns x0:x1, all bands, as a C-contiguous native-endian (h, w, B) array."""
        ...

    def close(self) -> None: ...


@dataclass
class ArrayCube:
    """A cube over any array supporting basic slicing (numpy, memmap, h5py dataset, zarr).

    ``axes`` names the array's axis order with the letters H, W, B (e.g. "BHW" for ENVI bsq,
    "HBW" for bil, "HWB" for bip). ``read`` slices only the requested window, so memory-mapped or
    chunked sources are never loaded whole.
    """

    array: Any
    axes: str = "HWB"
    wavelengths: list[float] | None = None
    band_names: list[str] | None = None
    files: list[Path] = field(default_factory=list)
    closer: Any = None

    def __post_init__(self) -> None:
        if sorted(self.axes) != ["B", "H", "W"]:
            raise ValueError(f"axes must be a permutation of 'HWB', got {self.axes!r}")
        if len(self.array.shape) != 3:
            raise InputError(f"expected a 3-D cube, got shape {tuple(self.array.shape)}")
        dims = dict(zip(self.axes, self.array.shape))
        self.shape = (int(dims["H"]), int(dims["W"]), int(dims["B"]))
        if min(self.shape) < 1:
            raise InputError(f"cube has an empty axis: (H, W, B) = {self.shape}")
        self.dtype = check_dtype(self.array.dtype, "cube")
        self._perm = tuple(self.axes.index(a) for a in "HWB")

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        index = {"H": slice(y0, y1), "W": slice(x0, x1), "B": slice(None)}
        window = np.asarray(self.array[tuple(index[a] for a in self.axes)])
        window = window.transpose(self._perm)
        return np.ascontiguousarray(window, dtype=self.dtype)

    def close(self) -> None:
        if self.closer is not None:
            self.closer()
            self.closer = None
