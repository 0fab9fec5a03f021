"""MATLAB .mat reader: v5/v7 through a bounded parser (matv5), v4 through scipy (both loaded whole), v7.3
through h5py (sliced lazily).

MATLAB is column-major, so in a v7.3 file an (H, W, B) variable appears to h5py as (B, W, H). The
reader says so with reversed axis letters instead of transposing anything in memory.
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import scipy.io

from hsgds.errors import InputError
from hsgds.preprocess.readers import matv5
from hsgds.preprocess.readers.base import ArrayCube, check_dtype, check_fits_in_memory, parse_failure
from hsgds.preprocess.readers.hdf5 import (
    band_axes,
    check_dataset,
    choose_variable,
    complex_arrays,
    guarded,
    list_datasets,
    refuse_unsupported,
)

__all__ = ["column_major_hdf5", "open_mat", "open_mat73", "read_mat73_labels", "read_mat_labels"]

#: whosmat classes that hold plain numbers (char, cell, struct, sparse, object are skipped).
_NUMERIC_CLASSES = {"double", "single", "logical", "int8", "uint8", "int16", "uint16",
                    "int32", "uint32", "int64", "uint64"}

#: Top-level groups MATLAB uses for its own bookkeeping in v7.3 files.
_MATLAB_INTERNALS = ("#refs#", "#subsystem#")

#: v7.3 MATLAB_class values that are numeric data (char arrays are uint16 datasets too).
_NUMERIC_CLASSES_73 = {c.encode() for c in _NUMERIC_CLASSES}


#: Bytes per element of each numeric class (the real part only: a lower bound for complex data).
_ITEMSIZE = {"double": 8, "single": 4, "logical": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2,
             "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}

_RESAVE = "re-save it with save(..., '-v7') or '-v7.3'"


def _version(path: Path) -> int:
    """0 for a v4 file (no header), 1 for level 5 (v5/v6/v7)."""
    try:
        with path.open("rb") as f:
            major = scipy.io.matlab.matfile_version(f)[0]
    except Exception as exc:
        raise parse_failure(path, "a MATLAB file", exc, _RESAVE) from None
    if major not in (0, 1):
        raise InputError(f"{path} has MATLAB format version {major} but no HDF5 signature; {_RESAVE}")
    return major


def _listing_v5(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every variable of a v4/v5 file, name to (shape, class), without loading any of them.

    Level-5 files go through hsgds's own bounded parser (matv5): scipy's C parser crashes on some
    damaged files. v4 files (pure-Python parser in scipy) go through scipy."""
    if _version(path) == 1:
        return {v.name: (v.shape, v.cls) for v in matv5.list_variables(path).values()}
    try:
        listing = scipy.io.whosmat(path)
    except Exception as exc:  # scipy's parser on a damaged file raises many types (KeyError, IndexError...)
        raise parse_failure(path, "a MATLAB file", exc, _RESAVE) from None
    return {name: (tuple(int(n) for n in shape), cls) for name, shape, cls in listing}


def _unsupported(name: str, shape: tuple[int, ...], cls: str, key_option: str | None) -> tuple[tuple[int, ...], str]:
    """A variable of MATLAB class ``cls`` that is no numeric array, for :func:`refuse_unsupported`: a sparse
    matrix (a ground truth of mostly zeros is often saved sparse) keeps its shape, so that it is named when it
    is the file's only one of its rank; any other (char, cell, struct...) is named only when chosen by key."""
    if cls == "sparse":
        return shape, f"is a sparse matrix, which is unsupported; save it full ({name} = full({name}))"
    option = f" with {key_option}" if key_option else ""
    # (a v5 file's fields and cells are no variables of their own: only MATLAB can take the array out)
    held = {"struct": f"x = {name}.field", "cell": f"x = {name}{{1}}"}.get(cls)
    out = f"save the array it holds as a variable of its own ({held}), or " if held else ""
    return (), f"is a {cls} array, not a numeric one; {out}choose a numeric variable{option}"


def _choose_v5(path: Path, ndim: int, key: str | None, key_option: str | None) -> str:
    """The numeric variable of a v4/v5 file to read: ``key``, or the only ``ndim``-D one (see
    :func:`choose_variable`); a variable that is no numeric array is named as what it is."""
    listing = _listing_v5(path)
    numeric = {name: shape for name, (shape, cls) in listing.items() if cls in _NUMERIC_CLASSES}
    others = {name: _unsupported(name, shape, cls, key_option)
              for name, (shape, cls) in listing.items() if cls not in _NUMERIC_CLASSES}
    refuse_unsupported(others, numeric, ndim, key, path.name, "variable")
    return choose_variable(numeric, ndim, key, path.name, "variable", key_option)


def _load_v5(path: Path, name: str) -> np.ndarray:
    """Load one variable of a v4/v5 file, after checking its size against the file and the memory."""
    if _version(path) == 1:
        return matv5.load_variable(path, matv5.list_variables(path)[name])
    shape, cls = _listing_v5(path)[name]
    # scipy lists every v4 matrix as "double", but v4 stores it as double, single, int32, int16, uint16 or
    # uint8 (scipy writes the array's own type): the file must hold at least a byte per element, and
    # loading it takes at most the class's size per element
    nbytes = math.prod(shape) * _ITEMSIZE[cls]
    stored = math.prod(shape)
    size = path.stat().st_size
    if stored > size:  # v4 files are never compressed: the data must be in the file
        raise InputError(f"variable {name!r} in {path} claims shape {shape} (at least {stored} bytes) but the file "
                         f"has {size} bytes; the file is damaged, {_RESAVE}")
    check_fits_in_memory(nbytes, f"variable {name!r} in {path.name} (loaded whole)",
                         "save it with save(..., '-v7.3'), which is read in windows")
    try:
        return scipy.io.loadmat(path, variable_names=[name], squeeze_me=False)[name]
    except Exception as exc:
        raise parse_failure(path, f"a MATLAB file (variable {name!r})", exc, _RESAVE) from None


def open_mat(path: Path, key: str | None = None, band_axis: str | None = None, key_option: str = "--key") -> ArrayCube:
    """Open a v4/v5/v7 .mat cube: the variable ``key``, or the file's only 3-D numeric variable.

    scipy cannot map these files, so the chosen variable is loaded whole (the others are not).
    ``band_axis`` "last" (default) means the MATLAB array is (H, W, B), "first" (B, H, W), "middle" (H, B, W).
    """
    axes = band_axes(band_axis)
    name = _choose_v5(path, 3, key, key_option)
    array = _load_v5(path, name)
    check_dtype(array.dtype, f"variable {name!r} in {path.name}")
    return ArrayCube(array, axes=axes, files=[path])


def read_mat_labels(path: Path, key: str | None = None, key_option: str | None = "--key") -> np.ndarray:
    """Load a v4/v5/v7 .mat label map: ``key`` or the file's only 2-D numeric variable (messages name the
    option ``key_option``, as :func:`choose_variable`)."""
    name = _choose_v5(path, 2, key, key_option)
    return _load_v5(path, name)


def _variables_73(f: h5py.File, key_option: str | None = "--key") -> tuple[
        dict[str, h5py.Dataset], dict[str, tuple[int, ...]], dict[str, tuple[tuple[int, ...], str]]]:
    """Numeric v7.3 variables by name, their shapes as MATLAB reports them (h5py's reversed), and the variables
    that are no numeric array (complex, sparse, char...) with why, for :func:`refuse_unsupported`."""
    unsupported = complex_arrays(f, _MATLAB_INTERNALS, column_major=True)
    # a sparse matrix is a group marked with its row count, holding its nonzeros (data, ir, jc)
    sparse: dict[str, h5py.Group] = {}
    f.visititems(lambda name, obj: sparse.setdefault(name, obj) if isinstance(obj, h5py.Group)
                 and "MATLAB_sparse" in obj.attrs and name.split("/", 1)[0] not in _MATLAB_INTERNALS else None)
    for name, group in sparse.items():
        columns = group["jc"].shape[0] - 1 if isinstance(group.get("jc"), h5py.Dataset) else 0
        rows = int(np.asarray(group.attrs["MATLAB_sparse"]).reshape(-1)[0])
        unsupported[name] = _unsupported(name, (rows, columns), "sparse", key_option)
    datasets = {}
    for name, dataset in list_datasets(f, skip=_MATLAB_INTERNALS).items():
        if any(name.startswith(group + "/") for group in sparse):
            continue
        cls = dataset.attrs.get("MATLAB_class", b"double")
        cls = cls.encode() if isinstance(cls, str) else bytes(cls)
        # Empty arrays are stored as their dimension vector with a MATLAB_empty flag.
        if cls in _NUMERIC_CLASSES_73 and not dataset.attrs.get("MATLAB_empty", 0):
            datasets[name] = dataset
        elif cls not in _NUMERIC_CLASSES_73:
            unsupported[name] = _unsupported(name, (), cls.decode(errors="replace"), key_option)
    return datasets, {n: tuple(reversed(d.shape)) for n, d in datasets.items()}, unsupported


#: what MATLAB (on every variable) and Octave's ``save -hdf5`` (on every variable's group) mark their objects with
_MARKERS = ("MATLAB_class", "OCTAVE_NEW_FORMAT")


def column_major_hdf5(path: Path) -> bool:
    """Whether an HDF5 file without MATLAB's text header was written by MATLAB or Octave, which store arrays
    column-major (dimensions reversed): an object marked by them. A file named .mat that h5py wrote holds
    row-major arrays: read as .mat, a (H, W, B) cube would come out transposed. A file h5py cannot open is
    left to the .mat reader, which names the problem."""
    try:
        with h5py.File(path, "r") as f:
            return f.visititems(lambda _, obj: True if any(m in obj.attrs for m in _MARKERS) else None) is not None
    except Exception:
        return True


def _open_73(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"cannot open {path} as a MATLAB v7.3 file ({exc}); check that the file is complete") from None
    except Exception as exc:  # the HDF5 library on a damaged superblock
        raise parse_failure(path, "a MATLAB v7.3 file", exc, "check that the file is complete") from None


def open_mat73(path: Path, key: str | None = None, band_axis: str | None = None,
               key_option: str = "--key") -> ArrayCube:
    """Open a v7.3 (HDF5) .mat cube lazily; the file stays open until ``close()``.

    ``band_axis`` refers to the MATLAB shape, exactly as for ``open_mat``.
    """
    axes = band_axes(band_axis)[::-1]
    f = _open_73(path)
    try:
        def select() -> h5py.Dataset:
            datasets, shapes, unsupported = _variables_73(f, key_option)
            chosen = None if key is None else key.strip("/")
            refuse_unsupported(unsupported, shapes, 3, chosen, path.name, "variable")
            name = choose_variable(shapes, 3, chosen, path.name, "variable", key_option)
            check_dtype(datasets[name].dtype, f"variable {name!r} in {path.name}")
            check_dataset(datasets[name], name, path, whole=False)
            return datasets[name]

        dataset = guarded(path, "a MATLAB v7.3 file", select)
        return guarded(path, "a MATLAB v7.3 file", lambda: ArrayCube(dataset, axes=axes, files=[path], closer=f.close))
    except BaseException:
        f.close()
        raise


def read_mat73_labels(path: Path, key: str | None = None, key_option: str | None = "--key") -> np.ndarray:
    """Read a v7.3 .mat label map (``key`` or the only 2-D numeric variable) in MATLAB's (H, W) order."""
    with _open_73(path) as f:
        def read() -> np.ndarray:
            datasets, shapes, unsupported = _variables_73(f, key_option)
            chosen = None if key is None else key.strip("/")
            refuse_unsupported(unsupported, shapes, 2, chosen, path.name, "variable")
            name = choose_variable(shapes, 2, chosen, path.name, "variable", key_option)
            check_dataset(datasets[name], name, path, whole=True)
            return datasets[name][()].T

        return guarded(path, "a MATLAB v7.3 file", read)
