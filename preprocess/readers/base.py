"""The source-cube interface every reader returns, and one implementation over any sliceable array."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hsgds.errors import InputError, one_line
from hsgds.format import DTYPES, MAX_NM, MIN_NM

#: dtypes a store can hold (native dtype is kept; casting happens at training time).
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in DTYPES)


def check_dtype(dtype: Any, what: str) -> np.dtype:
    """Return the native-endian form of ``dtype`` or raise InputError if stores cannot hold it."""
    dt = np.dtype(dtype)
    native = dt.newbyteorder("=")
    if native not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise InputError(f"{what} has unsupported dtype {dt} (supported: {names})")
    return native


#: Used when the operating system does not say how much memory is available.
_FALLBACK_BUDGET = 8 << 30


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_headroom() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2 or v1), or None when there is none."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # cgroup v2
            limit, used = (_read_int(f"/sys/fs/cgroup{rel}/memory.max"),
                           _read_int(f"/sys/fs/cgroup{rel}/memory.current"))
        elif "memory" in controllers.split(","):
            base = f"/sys/fs/cgroup/memory{rel}"
            limit, used = _read_int(f"{base}/memory.limit_in_bytes"), _read_int(f"{base}/memory.usage_in_bytes")
        else:
            continue
        if limit is not None and used is not None and limit < (1 << 60):
            return max(0, limit - used)
    return None


def memory_budget() -> int:
    """Bytes of memory a whole-array load may take: the least of the kernel's MemAvailable (or free
    pages), the room left under a container's cgroup limit and under this process's RLIMIT_AS."""
    candidates = []
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    if not candidates:
        try:
            candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            candidates.append(_FALLBACK_BUDGET)
    headroom = _cgroup_headroom()
    if headroom is not None:
        candidates.append(headroom)
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            vm = _status_kb("VmSize")
            candidates.append(max(0, soft - (vm or 0) * 1024))
    except (ImportError, OSError, ValueError):
        pass
    return min(candidates)


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits_in_memory(nbytes: int, what: str, fix: str) -> None:
    """Refuse, before allocating, an array that a header says is larger than the memory available.

    ``nbytes`` comes from values in the file (shape x itemsize); a damaged or hostile header must not
    make the reader try to allocate it.
    """
    budget = memory_budget()
    if nbytes > budget:
        raise InputError(f"{what} needs {nbytes / 2**30:.1f} GiB in memory but only {budget / 2**30:.1f} GiB "
                         f"is available; {fix}")


#: deflate, the strongest codec in common use for rasters, expands at most ~1032:1; a file decoding to
#: more than this many times its size (with a floor for small files) is damaged or hostile.
MAX_DECODE_RATIO = 1032
_DECODE_FLOOR = 64 << 20


def check_decoded_size(nbytes: int, path: Path, what: str) -> None:
    """Refuse, before decoding, data that would be far larger than the file could hold: a few hundred
    bytes of header (with missing strips or unallocated chunks filled by a fill value) must not make the
    reader allocate gigabytes."""
    size = os.stat(path).st_size
    limit = max(MAX_DECODE_RATIO * size, _DECODE_FLOOR)
    if nbytes > limit:
        raise InputError(f"{what} claims {nbytes} bytes of data but {path.name} has only {size} bytes (more than "
                         f"{MAX_DECODE_RATIO}x): the file is damaged; re-save it (uncompressed, or with deflate)")


def parse_failure(path: Path, what: str, exc: BaseException, fix: str) -> InputError:
    """An InputError for a third-party parser that failed on ``path`` in any way (its exception types
    on malformed input are not part of its contract, so they are reported, not trusted)."""
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return InputError(f"cannot read {path} as {what} ({type(exc).__name__}{': ' + detail if detail else ''}); {fix}")


def source_stamps(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    """(size, mtime in ns) of each file, to tell whether a source changed while it was being converted."""
    out = {}
    for p in paths:
        st = os.stat(p)
        out[Path(p)] = (st.st_size, st.st_mtime_ns)
    return out




def parse_nodata(text: str, where: str, fix: str) -> float:
    """A nodata value written as text in a file's metadata ("-9999", "nan", "0"): a float, NaN allowed; an
    InputError naming ``where`` and saying ``fix`` otherwise (an infinity marks no pixel a format writes)."""
    try:
        value = float(str(text).strip().strip("\x00").strip())
    except ValueError:
        raise InputError(f"{where}: nodata value {str(text)[:40]!r} is not a number; {fix}") from None
    if math.isinf(value):
        raise InputError(f"{where}: nodata value {text!r} is infinite; {fix}")
    return value


#: Multipliers from a file's wavelength units (ENVI "wavelength units", a CF "units" attribute) to nanometres.
_TO_NM = {
    "nanometers": 1.0, "nanometer": 1.0, "nanometres": 1.0, "nanometre": 1.0, "nm": 1.0,
    "micrometers": 1000.0, "micrometer": 1000.0, "micrometres": 1000.0, "micrometre": 1000.0,
    "microns": 1000.0, "micron": 1000.0, "um": 1000.0, "\u00b5m": 1000.0, "\u03bcm": 1000.0,
    "millimeters": 1e6, "millimeter": 1e6, "mm": 1e6,
}
_WAVENUMBER = ("wavenumber", "cm-1", "cm^-1")


def _nm(value: float) -> float:
    """A band centre converted to nm, to 15 significant digits: the conversion's binary rounding (1.011 um
    read 1010.9999999999999 nm) would put it a hair off the same centre given in nm, so a wavelength
    ``wavelength_tolerance`` away from it, or equally near two bands, picked another band, or none."""
    return float(f"{value:.15g}")


def wavelengths_in_nm(values: list[float], units: str, where: str) -> tuple[list[float] | None, str | None]:
    """Finite band centres in the file's ``units`` as nm and None, or None and why they cannot be recorded
    (``where``, e.g. the file name, starts the reason): units that are no length, or values outside
    MIN_NM-MAX_NM nm once converted (micrometres labelled as nanometres, band numbers).

    Without units ("" or "unknown") they are guessed from magnitude: imaging spectrometers cover roughly
    0.3-15 um, so values below 100 can only be micrometres and larger ones are taken as nanometres.
    """
    key = units.strip().lower()
    if key in _WAVENUMBER:
        if any(v <= 0 for v in values):
            return None, f"{where}: its wavenumbers (units {units}) include values <= 0"
        nm = [_nm(1e7 / v) for v in values]
    elif key in _TO_NM or key in ("", "unknown"):
        scale = _TO_NM.get(key) or (1000.0 if max(abs(v) for v in values) < 100 else 1.0)
        nm = [_nm(v * scale) if scale != 1.0 else v for v in values]
    else:  # Index, GHz, MHz, ...: not a length, so there is no honest nm value
        return None, f"{where}: its wavelength units ({units.strip()}) are not a length"
    lo, hi = min(nm), max(nm)
    if lo < MIN_NM or hi > MAX_NM:
        # matched by wavelength against other scenes they would select the wrong bands, or none
        read_as = f"units {units.strip()}" if key not in ("", "unknown") else "no units, guessed from magnitude"
        return None, f"{where}: its wavelengths read as {lo:g}-{hi:g} nm ({read_as}), outside {MIN_NM:g}-{MAX_NM:g} nm"
    return nm, None


def split_list(value: str, keep_empty: bool = False) -> list[str]:
    """Split an ENVI ``{a, b, c}`` value into its stripped items (``keep_empty``: an empty item stays, as "",
    so that item ``i`` keeps its position)."""
    inner = value.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1]
    return [item.strip() for item in inner.split(",") if keep_empty or item.strip()]


def bad_band_list(value: str, bands: int, where: str, fix: str) -> list[int]:
    """The bands an ENVI bad band list (``bbl = {1, 1, 0, ...}``: one flag per band, 1 good, 0 bad, as AVIRIS marks
    its water-vapour bands) flags bad, by index; ``where`` starts and ``fix`` ends the one-line InputError a list
    of another length, or a flag that is neither 0 nor 1, raises."""
    items = split_list(value)
    if len(items) != bands:
        raise InputError(f"{where} lists {len(items)} 'bbl' flags for {bands} bands; {fix}")
    flags = []
    for item in items:
        try:
            flag = float(item)
        except ValueError:
            flag = math.nan
        if flag not in (0, 1):
            raise InputError(f"{where}: 'bbl' holds {item[:40]!r}, not 0 (a bad band) or 1 (a good one); {fix}")
        flags.append(flag)
    return [b for b, flag in enumerate(flags) if flag == 0]


def unlabelled_at_nodata(raw: np.ndarray, nodata: float | None) -> np.ndarray:
    """A label map (or mask) whose file records a nodata value (a classification raster's 255, -1 or NaN): those
    pixels have no class, so they read as 0 (unlabelled), not as class 255."""
    if nodata is None or nodata == 0:
        return raw
    hit = np.isnan(raw) if math.isnan(nodata) else raw == nodata
    return np.where(hit, 0, raw) if hit.any() else raw


#: how a message about a source's unreadable nodata value ends: the options that make the converter ignore it
OVERRIDE_NODATA = "or override it with --nodata VALUE (or --nodata none)"


def recorded_nodata(cube: Any) -> float | None:
    """The nodata value ``cube``'s file records (None: it records none). A value the file records but that is
    no number is an InputError only here, when it is used, so ``--nodata VALUE`` or ``none`` can override it."""
    error = getattr(cube, "nodata_error", None)
    if error is not None:
        raise InputError(error)
    return getattr(cube, "nodata", None)


def unknown_epsg(geo: dict[str, Any] | None) -> str | None:
    """Why PROJ does not know the EPSG code a ``georeference`` record names (its error, as rasterio gives it), or
    None: a code it knows, no code, or no rasterio (``hsgds[geo]``) to ask, when the store format's range check
    is all. A code PROJ does not know stops a GeoTIFF map only once a whole scene is predicted."""
    code = None if geo is None else geo.get("epsg")
    if code is None:
        return None
    try:
        import rasterio
        from rasterio.crs import CRS
    except ImportError:
        return None
    try:
        with rasterio.Env():  # PROJ's error goes to logging, not printed to stderr beside ours
            CRS.from_epsg(code)
    except rasterio.errors.CRSError as exc:
        return " ".join(str(exc).split())
    return None


class SourceCube(Protocol):
    """A hyperspectral cube as the converter sees it: (H, W, B), read in windows."""

    shape: tuple[int, int, int]
    dtype: np.dtype
    #: band centres in nm, None for a band without one (PRISMA's unused bands); None when the file lists none
    wavelengths: list[float | None] | None
    band_names: list[str] | None
    files: list[Path]
    #: ``{"transform", "crs_wkt", "epsg"}`` (see :func:`hsgds.format.georeference_problem`) or None
    georeference: dict[str, Any] | None
    #: the value the file says marks pixels without data (GeoTIFF GDAL_NODATA, ENVI data ignore value, HDF5/netCDF
    #: _FillValue), or None
    nodata: float | None

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
    wavelengths: list[float | None] | None = None
    band_names: list[str] | None = None
    files: list[Path] = field(default_factory=list)
    closer: Any = None
    georeference: dict[str, Any] | None = None
    nodata: float | None = None
    #: why the nodata value the file records cannot be used (not a number), raised by :func:`recorded_nodata`
    nodata_error: str | None = None
    #: what records ``nodata`` when not the format's own field (a PAM sidecar's NoDataValue), as ``hsgds info`` names it
    nodata_field: str | None = None
    #: why the wavelengths the file lists are not recorded (units that are no length, values no band centre
    #: in nm can be); the converter warns with it
    wavelengths_note: str | None = None
    #: the file beside the cube that ``wavelengths`` were read from (an EnMAP product's metadata file), or None
    wavelengths_file: Path | None = None
    #: why the file's map grid is not recorded as ``georeference`` (a PRISMA L2D file's corners missing or not
    #: spanning its pixels); the converter warns with it
    georeference_note: str | None = None
    #: the bands the file flags bad (an ENVI header's ``bbl``, 0 for a bad band: AVIRIS's water-vapour bands), by
    #: index; None when it has no such list ([] when its list flags none)
    bad_bands: list[int] | None = None
    #: whether ``georeference`` came from a GeoTIFF whose coordinates name pixel centres (PixelIsPoint; the
    #: transform is the corner's all the same, as GDAL reads it by default)
    pixel_is_point: bool = False
    #: the value which, divided into the data, scales them to 0-1 reflectance (an ENVI header's ``reflectance
    #: scale factor``, e.g. 10000); None when the file gives none. Recorded, never applied
    reflectance_scale_factor: float | None = None

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
        self._stamps = source_stamps(self.files)

    def _check_unchanged(self) -> None:
        """A memory-mapped file that shrinks under us would kill the process (SIGBUS) on the next access
        past its new end; notice the change before touching the window instead."""
        for path, (size, _) in self._stamps.items():  # a new mtime at the same size cannot SIGBUS
            try:
                now = os.stat(path).st_size
            except OSError as exc:
                raise InputError(f"source {path} became unreadable during conversion ({exc.strerror}); "
                                 "convert again once it is in place") from None
            if now != size:
                raise InputError(f"source {path} changed during conversion ({size} bytes when opened, now {now}): "
                                 "it was truncated or rewritten; convert again once it is complete")

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        if self.array is None:
            raise InputError("the source cube is closed")
        self._check_unchanged()
        index = {"H": slice(y0, y1), "W": slice(x0, x1), "B": slice(None)}
        try:
            window = np.asarray(self.array[tuple(index[a] for a in self.axes)])
        except (InputError, MemoryError):
            raise
        except Exception as exc:  # h5py / numpy on a damaged or vanished file: name the file and window
            where = self.files[0] if self.files else "the source"
            raise InputError(f"cannot read rows {y0}:{y1}, columns {x0}:{x1} of {where} "
                             f"({one_line(exc, with_type=True)}); the file is damaged or truncated") from None
        window = window.transpose(self._perm)
        if window.shape != (y1 - y0, x1 - x0, self.shape[2]):
            raise InputError(f"source {self.files[0] if self.files else ''} returned a {window.shape} window for rows "
                             f"{y0}:{y1}, columns {x0}:{x1}; the file is truncated or inconsistent")
        return np.ascontiguousarray(window, dtype=self.dtype)

    def close(self) -> None:
        if self.closer is not None:
            self.closer()
            self.closer = None
