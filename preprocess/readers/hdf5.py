"""HDF5 reader: one dataset of a file, sliced through h5py so chunks are read only when a window needs them.

Also home of ``choose_variable``, the "exactly one N-D array, or --key" rule that the .mat reader
shares (MATLAB v7.3 files are HDF5 files).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from hsgds import format as fmt
from hsgds._wording import set_to
from hsgds.errors import DependencyError, InputError, shown
from hsgds.preprocess.readers.base import (
    OVERRIDE_NODATA,
    ArrayCube,
    check_decoded_size,
    check_dtype,
    check_fits_in_memory,
    parse_failure,
    parse_nodata,
    unlabelled_at_nodata,
    wavelengths_in_nm,
)
from hsgds.preprocess.readers.packed import Unpacked, unpacked_nodata

__all__ = ["BAND_AXES", "COMPLEX", "SeveralArrays", "band_axes", "band_centres", "choose_variable", "complex_arrays",
           "declared_nodata", "fits_rank", "list_datasets", "open_hdf5", "packing", "prisma_georeference",
           "read_hdf5_labels", "refuse_unsupported"]

#: How many variables an error message lists before summarising the rest.
_LIST_LIMIT = 12


class SeveralArrays(InputError):
    """The file holds several arrays that fit and no ``--key`` chose one (``hsgds info`` says so rather than
    describing the file's one label map as if the file held no cube)."""


#: Axis letters of an array by its ``band_axis``: "middle" is the line-interleaved (rows, bands, columns)
#: layout of PRISMA's HE5 cubes and of ENVI bil data saved as an array.
BAND_AXES = {"last": "HWB", "first": "BHW", "middle": "HBW"}


def band_axes(band_axis: str | None) -> str:
    """Axis letters of an (H, W, B), (B, H, W) or (H, B, W) array for a ``band_axis`` of "last" (or None),
    "first" or "middle".

    Raises
    ------
    InputError
        ``band_axis`` is none of those.
    """
    if band_axis is None:
        return BAND_AXES["last"]
    if isinstance(band_axis, str) and band_axis in BAND_AXES:
        return BAND_AXES[band_axis]
    raise InputError(f"band_axis must be 'first' (B, H, W), 'middle' (H, B, W) or 'last' (H, W, B), "
                     f"got {shown(band_axis)}")


def _describe(entries: dict[str, tuple[int, ...]]) -> str:
    """Format ``name (shape)`` pairs for an error message, capped at a readable length."""
    names = sorted(entries)
    shown = ", ".join(f"{n} {entries[n]}" for n in names[:_LIST_LIMIT])
    if len(names) > _LIST_LIMIT:
        shown += f", ... and {len(names) - _LIST_LIMIT} more"
    return shown or "none"


def fits_rank(shape: tuple[int, ...], ndim: int) -> bool:
    """Whether an array of ``shape`` can be chosen as the ``ndim``-D array without a key. MATLAB stores scalars
    and vectors as 2-D (1, n) arrays; they are never label maps."""
    return len(shape) == ndim and (ndim != 2 or min(shape) > 1)


def choose_variable(entries: dict[str, tuple[int, ...]], ndim: int, key: str | None, where: str, noun: str,
                    option: str | None = "--key") -> str:
    """Pick the array to read: ``key`` if given, else the only ``ndim``-D array in ``entries``.

    Parameters
    ----------
    entries
        Numeric arrays in the file, name to shape (as the user sees it).
    ndim
        3 for a cube, 2 for a label map.
    key
        The user's choice, or None to pick automatically.
    where
        File name used in messages.
    noun
        "variable" (.mat) or "dataset" (HDF5).
    option
        The option that chooses the array, for messages (``--labels-key`` for a label map), or None where
        none can (a train / val / test mask): the message then says to save the array alone in its file.

    Raises
    ------
    InputError
        ``key`` is absent or has the wrong rank, or there is not exactly one candidate. The message
        lists what the file holds so the user can choose with ``option``.
    """
    choose = (f"choose one with {option}" if option is not None
              else f"no option chooses one: save the {ndim}-D array in a file of its own")
    if key is not None:
        if key not in entries:
            raise InputError(
                f"{where} has no numeric {noun} {key!r} ({noun}s: {_describe(entries)}); {choose}"
            )
        if len(entries[key]) != ndim:
            want = "a cube needs 3 dimensions (H, W, B)" if ndim == 3 else "a label map needs 2 dimensions (H, W)"
            raise InputError(f"{noun} {key!r} in {where} has shape {entries[key]}; {want}")
        return key
    candidates = [n for n, s in entries.items() if fits_rank(s, ndim)]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        listed = _describe({n: entries[n] for n in candidates})
        raise SeveralArrays(f"{where} holds several {ndim}-D arrays ({listed}); {choose}")
    if option is not None and any(len(s) == ndim and max(s) > 1 for s in entries.values()):
        # (fits_rank) a vector may be a 1 x W scene's label map, or a list beside a cube: the user knows which
        raise InputError(f"{where} holds no {ndim}-D numeric array of more than one row and column ({noun}s: "
                         f"{_describe(entries)}); a label map of a single row or column is read only when named "
                         f"with {option}")
    raise InputError(
        f"{where} holds no {ndim}-D numeric array ({noun}s: {_describe(entries)}); "
        f"check the file{'' if option is None else f' or choose one with {option}'}"
    )


def list_datasets(group: h5py.Group, skip: tuple[str, ...] = ()) -> dict[str, h5py.Dataset]:
    """All numeric datasets below ``group`` by path (no leading slash), ignoring top-level names in ``skip``."""
    found: dict[str, h5py.Dataset] = {}

    def visit(name: str, obj: object) -> None:
        if name.split("/", 1)[0] in skip or not isinstance(obj, h5py.Dataset):
            return
        # Compound, string and reference datasets cannot be cubes or label maps.
        if obj.dtype.kind in "biuf":
            found[name] = obj

    group.visititems(visit)
    return found


def _is_complex(dtype: np.dtype) -> bool:
    """numpy's complex types (h5py stores them as a compound of floats ``r``, ``i``) and MATLAB's v7.3 complex
    arrays (a compound of ``real``, ``imag``)."""
    if dtype.kind == "c":
        return True
    names = tuple(n.lower() for n in dtype.names or ())
    return names in (("r", "i"), ("real", "imag")) and all(dtype[n].kind in "iuf" for n in dtype.names)


#: why a complex array is not read, and what to do instead
COMPLEX = "is complex, which is unsupported; save its magnitude or real part"


def complex_arrays(group: h5py.Group, skip: tuple[str, ...] = (),
                   column_major: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """The complex datasets below ``group`` by path (ignoring top-level names in ``skip``), each with its shape
    (``column_major``: as MATLAB reports it, h5py's reversed) and why it is not read, for
    :func:`refuse_unsupported`."""
    found: dict[str, tuple[tuple[int, ...], str]] = {}

    def visit(name: str, obj: object) -> None:
        if name.split("/", 1)[0] not in skip and isinstance(obj, h5py.Dataset) and _is_complex(obj.dtype):
            found[name] = (tuple(reversed(obj.shape)) if column_major else tuple(obj.shape), COMPLEX)

    group.visititems(visit)
    return found


def refuse_unsupported(unsupported: dict[str, tuple[tuple[int, ...], str]], numeric: dict[str, tuple[int, ...]],
                       ndim: int, key: str | None, where: str, noun: str) -> None:
    """Name an array the reader cannot read (``unsupported``: name to its shape and why, e.g. :data:`COMPLEX`) as
    such when ``key`` chooses it, or when it is what the file holds of ``ndim``-D arrays (none of the ``numeric``
    ones fits): it is no numeric array to choose, but "no such array" would leave the user looking for the one
    they can see."""
    if key is not None:
        chosen = [key] if key in unsupported else []
    elif not any(fits_rank(s, ndim) for s in numeric.values()):
        chosen = sorted(n for n, (s, _) in unsupported.items() if fits_rank(s, ndim))
    else:
        chosen = []
    if chosen:
        raise InputError(f"{noun} {chosen[0]!r} in {where} {unsupported[chosen[0]][1]}")


def _open(path: Path) -> h5py.File:
    """Open ``path`` read-only, turning h5py's OSError into an InputError."""
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"cannot open {path} as HDF5 ({exc}); check that the file is complete") from None
    except Exception as exc:  # the HDF5 library on a damaged superblock
        raise parse_failure(path, "HDF5", exc, "check that the file is complete") from None


def guarded(path: Path, what: str, fn):
    """Run ``fn()`` (listing / selecting / reading objects of an open file); a damaged file may make h5py
    raise RuntimeError, KeyError, OSError, ValueError...: report any of them as an InputError naming the file."""
    try:
        return fn()
    except (InputError, DependencyError, MemoryError):
        raise
    except Exception as exc:
        raise parse_failure(path, what, exc, "check that the file is complete") from None


#: HDF5 filters that h5py's own build lacks, by their registered ids (hdf5plugin provides them)
_PLUGIN_FILTERS = {307: "bzip2", 32001: "Blosc", 32004: "LZ4", 32008: "Bitshuffle", 32013: "ZFP", 32015: "Zstandard",
                   32017: "SZ", 32018: "FCIDECOMP", 32024: "SZ3", 32026: "Blosc2"}


def _check_filters(dataset: h5py.Dataset, name: str, path: Path) -> None:
    """Refuse, before any read, a dataset compressed with an HDF5 filter that no loaded plugin decodes (netCDF
    4.9 writes Zstandard, Blosc or bzip2 on request): its reads would fail as if the file were damaged. The
    filters of hdf5plugin, when it is installed, are registered by importing it."""
    plist = dataset.id.get_create_plist()
    codes = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    missing = [c for c in codes if not h5py.h5z.filter_avail(c)]
    if missing:
        try:
            import hdf5plugin  # noqa: F401  (registers its filters with HDF5)
        except ImportError:
            pass
        missing = [c for c in missing if not h5py.h5z.filter_avail(c)]
    if missing:
        code = missing[0]
        raise DependencyError(f"cannot decode dataset {name!r} in {path.name}: it is compressed with the HDF5 filter "
                              f"{code}{f' ({_PLUGIN_FILTERS[code]})' if code in _PLUGIN_FILTERS else ''}, which this "
                              "h5py has no plugin for; install one (pip install hdf5plugin), or re-save it with gzip")


def check_dataset(dataset: h5py.Dataset, name: str, path: Path, *, whole: bool) -> None:
    """Refuse, before any read, a dataset compressed with a filter no plugin decodes, or whose declared chunk
    (read even for a one-pixel window) or, when it is loaded whole (``whole``), whose full size would not fit
    in memory."""
    _check_filters(dataset, name, path)
    itemsize = dataset.dtype.itemsize
    if dataset.chunks is not None:
        check_fits_in_memory(int(np.prod(dataset.chunks, dtype=object)) * itemsize,
                             f"one chunk of dataset {name!r} in {path.name}", "re-save it with smaller chunks")
    if whole:
        nbytes = int(np.prod(dataset.shape, dtype=object)) * itemsize
        check_decoded_size(nbytes, path, f"dataset {name!r} of shape {dataset.shape}")
        check_fits_in_memory(nbytes, f"dataset {name!r} in {path.name}", "check the file")


#: CF's attributes for a variable's nodata value, in the order netCDF reads them
_NODATA_ATTRS = ("_FillValue", "missing_value")


def declared_nodata(dataset: h5py.Dataset, name: str, path: Path) -> float | None:
    """The value a netCDF-4 / HDF5 product declares for pixels without data (CF's ``_FillValue``, else a single
    ``missing_value``: EMIT's reflectance says -9999), or None. netCDF writes ``_FillValue`` only when the
    producer set one, so a declared value is meant."""
    for attr in _NODATA_ATTRS:
        if attr not in dataset.attrs:
            continue
        value = np.asarray(dataset.attrs[attr]).reshape(-1)
        if value.size != 1:
            if attr == "missing_value":
                return None  # several missing values (CF allows a list): no single nodata value to apply
            raise InputError(f"dataset {name!r} in {path.name}: attribute {attr} holds {value.size} values, not one; "
                             f"fix it, {OVERRIDE_NODATA}")
        text = value[0].decode(errors="replace") if isinstance(value[0], bytes) else str(value[0])
        return parse_nodata(text, f"dataset {name!r} in {path.name}", f"fix its {attr} attribute, {OVERRIDE_NODATA}")
    return None


def packing(dataset: h5py.Dataset, name: str, path: Path) -> Unpacked | None:
    """The CF packing of a variable (its ``scale_factor`` and ``add_offset`` attributes: a netCDF product's
    int16 reflectance times 0.0001; its ``_Unsigned`` attribute on signed integers), or None when it has none,
    or one that leaves the values as they are.

    Raises
    ------
    InputError
        An attribute holds no single finite number.
    """
    found = {}
    for attr, default in (("scale_factor", 1.0), ("add_offset", 0.0)):
        value = np.asarray(dataset.attrs[attr] if attr in dataset.attrs else np.float32(default)).reshape(-1)
        if value.size != 1 or value.dtype.kind not in "iuf" or not np.isfinite(value[0]):
            raise InputError(f"dataset {name!r} in {path.name}: attribute {attr} holds {value.tolist()[:4]}, not one "
                             "number; fix it (netCDF readers unpack the values with it)")
        found[attr] = value
    unsigned = dataset.dtype.kind == "i" and _attr_text(dataset, "_Unsigned").strip().lower() == "true"
    scaled = not (found["scale_factor"][0] == 1 and found["add_offset"][0] == 0)
    if not (unsigned or scaled):
        return None
    return Unpacked(dataset, unsigned, found["scale_factor"] if scaled else None, found["add_offset"] if scaled else None)


def _attr_text(dataset: h5py.Dataset, name: str) -> str:
    """A string attribute (bytes, str or a one-element array of either) as text; "" when absent."""
    value = dataset.attrs.get(name)
    if value is None:
        return ""
    value = np.asarray(value).reshape(-1)[0] if np.ndim(value) else value
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


#: PRISMA's root attributes listing a detector's band centres (nm, band i of the cube at element i, in descending
#: order) and their flags (1: the band is used; 0: unused, its centre 0), by the detector a cube's name holds
_PRISMA_LISTS = {"vnir": ("List_Cw_Vnir", "List_Cw_Vnir_Flags"), "swir": ("List_Cw_Swir", "List_Cw_Swir_Flags")}


def _prisma_centres(f: h5py.File, cube: h5py.Dataset, bands: int, path: Path,
                    axis_option: str = "--band-axis") -> tuple[list[float | None] | None, str | None]:
    """The band centres of a PRISMA cube (L1 or L2 HE5: ``VNIR_Cube``, ``SWIR_Cube`` and their error matrices,
    (rows, bands, columns)) from the file's root attribute ``List_Cw_Vnir`` or ``List_Cw_Swir``, taken by the
    detector the dataset's name holds: the product ties a list to its cube by name, not by length (a cube of
    another band count that happened to match the other list would take wrong centres); the length is checked.
    None, or None and why they are not recorded; (None, None) for a dataset of neither detector, or a file
    without the list.

    A band flagged unused in ``List_Cw_*_Flags`` (or whose centre is 0 or not finite: PRISMA writes 0 for
    the unused bands at the ends of each detector's range) has no centre: None in its place (a store records
    it as null), the others' centres as listed; a list without any centre is none."""
    leaf = cube.name.rsplit("/", 1)[-1].lower()
    detectors = [d for d in _PRISMA_LISTS if d in leaf]
    if len(detectors) != 1 or _PRISMA_LISTS[detectors[0]][0] not in f.attrs:
        return None, None
    name, flags_name = _PRISMA_LISTS[detectors[0]]
    where = f"{path.name} attribute {name}"
    raw = np.asarray(f.attrs[name]).reshape(-1)
    if raw.dtype.kind not in "iuf":
        return None, f"{where}: its band centres are not numbers"
    values = raw.astype(np.float64)
    if values.size != bands:
        # read without --band-axis middle, a PRISMA cube's columns are its "bands": name the axis the list fits
        fits = [i for i, n in enumerate(cube.shape) if n == values.size]
        axis = ("first", "middle", "last")[fits[0]] if len(fits) == 1 else ""
        hint = (f", as many as the dataset's {axis} axis holds (PRISMA's cubes are rows, bands, columns: "
                f"{set_to(axis_option, axis)})"
                if len(cube.shape) == 3 and len(fits) == 1 else "")
        return None, f"{where}: it lists {values.size} band centres for the cube's {bands} bands{hint}"
    unused = ~np.isfinite(values) | (values == 0)
    if flags_name in f.attrs:
        flags = np.asarray(f.attrs[flags_name]).reshape(-1)
        if flags.dtype.kind not in "iub":
            return None, f"{where}: {flags_name} holds {flags.dtype.name} values, not integer flags"
        if flags.size != bands:
            return None, f"{where}: {flags_name} holds {flags.size} flags for the cube's {bands} bands"
        unused |= flags == 0
    if unused.all():
        return None, f"{where}: no band has a centre (every one unused: 0 in {flags_name} or as its centre)"
    nm, note = wavelengths_in_nm(values[~unused].tolist(), "nm", where)
    if nm is None:
        return None, note
    # the unused bands (all zeros in a real product) stay in the cube, without a centre to be selected by
    centres: list[float | None] = [None] * bands
    for i, w in zip(np.flatnonzero(~unused).tolist(), nm):
        centres[i] = w
    return centres, None


#: PRISMA L2D's root attributes giving its map grid: the EPSG code of its UTM zone and the map coordinates of the
#: centres of the upper-left and lower-right pixels (as EnMAP-Box's and prismaread's L2D importers read them)
_PRISMA_GRID = ("Epsg_Code", "Product_ULcorner_easting", "Product_ULcorner_northing", "Product_LRcorner_easting",
                "Product_LRcorner_northing")
#: PRISMA's VNIR and SWIR ground sampling distance (m); the L2D grid's spacing is checked against it
PRISMA_PIXEL_M = 30.0
#: how far (a share of PRISMA_PIXEL_M) the spacing the corners give may stray from it (corners rounded in the file)
_PRISMA_PIXEL_SLACK = 0.01


def _attr_number(value: object) -> float | None:
    """A root attribute holding one number (as h5py reads it: a scalar, a one-element array, or its text), else None."""
    value = np.asarray(value).reshape(-1)
    if value.size != 1:
        return None
    item = value[0]
    try:
        return float(item.decode() if isinstance(item, bytes) else item)
    except (TypeError, ValueError, UnicodeDecodeError):
        return None


def _grid_spacing(span: float, pixels: int) -> float | None:
    """The spacing of ``pixels`` pixel centres whose first and last lie ``span`` metres apart, or None when it is not
    PRISMA's 30 m (within the slack); one pixel has no spacing of its own: its corners must coincide."""
    slack = _PRISMA_PIXEL_SLACK * PRISMA_PIXEL_M
    if pixels == 1:
        return PRISMA_PIXEL_M if abs(span) <= slack else None
    spacing = span / (pixels - 1)
    return spacing if abs(spacing - PRISMA_PIXEL_M) <= slack else None


def prisma_georeference(f: h5py.File, cube: h5py.Dataset, axes: str, path: Path,
                        axis_option: str = "--band-axis") -> tuple[dict | None, str | None]:
    """The map grid of a PRISMA L2D cube (a dataset in a ``PRS_L2D_*`` swath, read with axis letters ``axes``) from
    the file's root attributes (see ``_PRISMA_GRID``), as the ``georeference`` record; and None, or None and why it
    is not recorded (attributes missing or no numbers, corners that do not span the cube's pixels at PRISMA's
    30 m). (None, None) for any other dataset: L1, L2B and L2C products are not geocoded (their per-pixel
    latitude / longitude are no regular grid).

    The corner attributes are the centres of the corner pixels, so the grid's outer corner lies half a pixel
    beyond the upper-left one, and the spacing is their distance over one pixel fewer than the cube holds."""
    if "/PRS_L2D_" not in cube.name:
        return None, None
    where = f"{path.name} (PRISMA L2D)"
    missing = [name for name in _PRISMA_GRID if name not in f.attrs]
    if missing:
        return None, f"{where}: no root attribute {', '.join(missing)}, so its map grid is unknown"
    read = {name: _attr_number(f.attrs[name]) for name in _PRISMA_GRID}
    values = {name: v for name, v in read.items() if v is not None and np.isfinite(v)}
    if len(values) < len(read):
        bad = [name for name in read if name not in values]
        return None, f"{where}: root attribute {', '.join(bad)} holds no number"
    epsg = values["Epsg_Code"]
    if not (epsg.is_integer() and 0 < epsg < 1 << 20):
        return None, f"{where}: root attribute Epsg_Code holds {epsg:g}, no EPSG code"
    ul_x, ul_y = values["Product_ULcorner_easting"], values["Product_ULcorner_northing"]
    east, south = values["Product_LRcorner_easting"] - ul_x, ul_y - values["Product_LRcorner_northing"]
    height, width = (cube.shape[axes.index(a)] for a in "HW")
    dx, dy = _grid_spacing(east, width), _grid_spacing(south, height)
    if dx is None or dy is None:
        # read without --band-axis middle, a PRISMA cube's bands are its "columns": name the axis that fits
        fits = axes != BAND_AXES["middle"] and None not in (_grid_spacing(east, cube.shape[2]),
                                                            _grid_spacing(south, cube.shape[0]))
        hint = f" (PRISMA's cubes are rows, bands, columns: {set_to(axis_option, 'middle')})" if fits else ""
        return None, (f"{where}: its corner pixels' centres lie {east:.10g} m east and {south:.10g} m south of each "
                      f"other, where the cube's {height}x{width} pixels of {PRISMA_PIXEL_M:g} m span "
                      f"{(width - 1) * PRISMA_PIXEL_M:g} m and {(height - 1) * PRISMA_PIXEL_M:g} m{hint}")
    geo = fmt.make_georeference([ul_x - dx / 2, dx, 0.0, ul_y + dy / 2, 0.0, -dy], None, int(epsg))
    why = fmt.georeference_problem(geo)
    return (None, f"{where}: unusable map grid ({why})") if why else (geo, None)


def band_centres(f: h5py.File, cube: h5py.Dataset, bands: int, path: Path,
                 axis_option: str = "--band-axis") -> tuple[list[float | None] | None, str | None]:
    """The cube's band centres in nm from the file: the 1-D numeric dataset of ``bands`` values whose name
    holds "wavelength" (EMIT's ``sensor_band_parameters/wavelengths``, a netCDF coordinate variable), in its CF
    ``units`` (or guessed from magnitude), else PRISMA's root attribute of the cube's detector (see
    :func:`_prisma_centres`); and None, or None and why they are not recorded (see :func:`wavelengths_in_nm`).
    (None, None) when the file has neither.

    Flags named for wavelengths (EMIT's ``good_wavelengths``, 0 or 1 per band) are no band centres; of several
    lists that differ, the one named exactly "wavelength(s)" is taken, else none."""
    found = {name: np.asarray(d[()], np.float64) for name, d in list_datasets(f).items()
             if "wavelength" in name.rsplit("/", 1)[-1].lower() and d.ndim == 1 and d.shape[0] == bands
             and d.dtype.kind in "iuf" and d.name != cube.name}
    found = {name: v for name, v in found.items() if not np.isin(v, (0, 1)).all()}
    if not found:
        return _prisma_centres(f, cube, bands, path, axis_option)
    name, first = next(iter(found.items()))
    if any(not np.array_equal(v, first, equal_nan=True) for v in found.values()):
        exact = [n for n in found if n.rsplit("/", 1)[-1].lower() in ("wavelength", "wavelengths")]
        if len(exact) != 1:
            return None, (f"{path.name}: its datasets {', '.join(sorted(found))} list different wavelengths for "
                          f"the cube's {bands} bands")
        name, first = exact[0], found[exact[0]]
    where = f"{path.name} dataset {name!r}"
    fill = declared_nodata(f[name], name, path)
    if not np.isfinite(first).all() or (fill is not None and (first == fill).any()):
        return None, f"{where}: its wavelengths include NaN, infinity or its fill value"
    return wavelengths_in_nm(first.tolist(), _attr_text(f[name], "units"), where)


def open_hdf5(path: Path, key: str | None = None, band_axis: str | None = None, key_option: str = "--key",
              axis_option: str = "--band-axis") -> ArrayCube:
    """Open one 3-D dataset of an HDF5 file as a cube; the file stays open until ``close()``.

    ``key`` is the dataset path; without it the file must hold exactly one 3-D numeric dataset.
    ``band_axis`` "last" (default) reads the dataset as (H, W, B), "first" as (B, H, W), "middle" as (H, B, W).
    """
    axes = band_axes(band_axis)
    f = _open(path)
    try:
        def select() -> h5py.Dataset:
            datasets = list_datasets(f)
            shapes = {n: d.shape for n, d in datasets.items()}
            refuse_unsupported(complex_arrays(f), shapes, 3, _strip(key), path.name, "dataset")
            name = choose_variable(shapes, 3, _strip(key), path.name, "dataset", key_option)
            dataset = datasets[name]
            check_dtype(dataset.dtype, f"dataset {name!r} in {path.name}")
            check_dataset(dataset, name, path, whole=False)
            return dataset

        dataset = guarded(path, "HDF5", select)
        name = dataset.name.lstrip("/")
        unpacked = guarded(path, "HDF5", lambda: packing(dataset, name, path))
        nodata, nodata_error = None, None
        try:
            nodata = guarded(path, "HDF5", lambda: declared_nodata(dataset, name, path))
        except InputError as exc:  # refused when used: --nodata may override it
            nodata_error = str(exc)
        nodata = unpacked_nodata(unpacked, nodata)
        bands = dataset.shape[axes.index("B")]
        try:
            wavelengths, note = guarded(path, "HDF5", lambda: band_centres(f, dataset, bands, path, axis_option))
        except InputError as exc:  # a damaged or odd wavelength dataset: said, not fatal (--wavelengths gives them)
            wavelengths, note = None, str(exc)
        try:
            geo, geo_note = guarded(path, "HDF5", lambda: prisma_georeference(f, dataset, axes, path, axis_option))
        except InputError as exc:  # a damaged attribute: said, not fatal (the map just carries no coordinates)
            geo, geo_note = None, str(exc)
        return guarded(path, "HDF5", lambda: ArrayCube(dataset if unpacked is None else unpacked, axes=axes,
                                                        files=[path], closer=f.close,
                                                        nodata=nodata, nodata_error=nodata_error,
                                                        wavelengths=wavelengths, wavelengths_note=note,
                                                        georeference=geo, georeference_note=geo_note))
    except BaseException:
        f.close()
        raise


def read_hdf5_labels(path: Path, key: str | None = None, key_option: str | None = "--key") -> np.ndarray:
    """Read one 2-D dataset of an HDF5 file (``key`` or the only 2-D one) into memory; pixels at its declared
    ``_FillValue`` (a netCDF classification's 255 or -1) read as 0 (unlabelled), as a GeoTIFF's nodata does."""
    with _open(path) as f:
        def read() -> np.ndarray:
            datasets = list_datasets(f)
            shapes = {n: d.shape for n, d in datasets.items()}
            refuse_unsupported(complex_arrays(f), shapes, 2, _strip(key), path.name, "dataset")
            name = choose_variable(shapes, 2, _strip(key), path.name, "dataset", key_option)
            check_dataset(datasets[name], name, path, whole=True)
            try:
                nodata = declared_nodata(datasets[name], name, path)
            except InputError as exc:  # (--nodata is the cube's: a label file's value can only be fixed)
                raise InputError(str(exc).replace(f", {OVERRIDE_NODATA}", "")) from None
            unpacked = packing(datasets[name], name, path)  # (a netCDF-3 class map's uint8 kept as _Unsigned bytes)
            raw = datasets[name][()] if unpacked is None else unpacked.unpack(datasets[name][()])
            return unlabelled_at_nodata(raw, unpacked_nodata(unpacked, nodata))

        return guarded(path, "HDF5", read)


def _strip(key: str | None) -> str | None:
    """Accept HDF5 paths with or without the leading slash."""
    return None if key is None else key.strip("/")
