"""Untrusted source files: property tests over random and mutated inputs for every reader, and hand-made
absurd headers. The only acceptable outcomes are success or an HsgdsError (never another exception,
never a crash, never an allocation sized by an unchecked header value), in bounded time.

The longer coverage-guided run is fuzz/fuzz_readers.py (atheris, not run in CI); see docs/reliability.md.
"""

from __future__ import annotations

import atexit
import io
import logging
import shutil
import struct
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hsgds.errors import HsgdsError, InputError
from hsgds.preprocess.readers import base as reader_base
from hsgds.preprocess.readers import detect_format, open_cube, read_labels
from hsgds.preprocess.readers.envi import parse_header

FUZZ = settings(max_examples=150, deadline=3000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SUFFIXES = (".npy", ".tif", ".h5", ".mat", ".hdr", ".img", "")
_DIR = Path(tempfile.mkdtemp(prefix="hsgds-prop-"))
atexit.register(shutil.rmtree, _DIR, True)


@pytest.fixture(autouse=True, scope="module")
def quiet_tifffile():
    """tifffile logs every repair it makes to a damaged file; the tests only care about the outcome."""
    logger = logging.getLogger("tifffile")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _write(name: str, data: bytes) -> Path:
    path = _DIR / name
    path.write_bytes(data)
    return path


def exercise(path: Path, key: str | None = None) -> None:
    """What the converter does with a source: detect, open, read two windows, read as labels. Any exception
    that is not an HsgdsError fails the test; so does taking longer than the example deadline."""
    try:
        detect_format(path)
        cube = open_cube(path, key=key)
    except HsgdsError:
        pass
    else:
        try:
            h, w, b = cube.shape
            assert min(h, w, b) >= 1
            window = cube.read(0, min(h, 3), 0, min(w, 3))
            assert window.shape == (min(h, 3), min(w, 3), b) and window.dtype == cube.dtype
            cube.read(h - 1, h, w - 1, w)
        except HsgdsError:
            pass
        finally:
            cube.close()
    try:
        labels = read_labels(path, key=key)
        assert labels.ndim == 2 and labels.dtype == np.int64
    except HsgdsError:
        pass


def _mutate(seed_bytes: bytes, data) -> bytes:
    """A few byte overwrites, then maybe a truncation: damaged files that keep their signature."""
    buf = bytearray(seed_bytes)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    return bytes(buf)


# -- ENVI ------------------------------------------------------------------------------------------------

_values = st.one_of(st.integers(-5, 2**70).map(str), st.sampled_from(["", "x", "1e9", "{1, 2}", "0x10", "  7 "]),
                    st.text(max_size=20))
_fields = st.fixed_dictionaries({}, optional={
    "samples": _values, "lines": _values, "bands": _values, "header offset": _values,
    "data type": st.one_of(st.sampled_from(["1", "2", "4", "5", "6", "9", "12", "99"]), _values),
    "interleave": st.sampled_from(["bsq", "bil", "bip", "BIP", "xyz"]),
    "byte order": st.sampled_from(["0", "1", "2", "-1"]),
    "wavelength": st.sampled_from(["{1, 2, 3}", "{400, nan}", "{", "{a, b}", "{1e400}"]),
    "wavelength units": st.sampled_from(["nm", "Micrometers", "index", "cm-1", ""]),
    "band names": st.sampled_from(["{a, b, c}", "{}", "{x"]),
    "file compression": st.sampled_from(["0", "1"]),
})


@FUZZ
@given(fields=_fields, size=st.integers(0, 4096), junk=st.binary(max_size=64), via_binary=st.booleans())
def test_envi_random_headers(fields, size, junk, via_binary):
    text = "ENVI\n" + "".join(f"{k} = {v}\n" for k, v in fields.items())
    hdr = _write("e.hdr", text.encode("utf-8", "replace") + junk)
    binary = _write("e.img", bytes(size))
    t0 = time.perf_counter()
    try:
        parse_header(hdr)
    except InputError:
        pass
    exercise(binary if via_binary else hdr)
    assert time.perf_counter() - t0 < 2


@FUZZ
@given(st.binary(max_size=2048))
def test_envi_header_parser_random_bytes(raw):
    try:
        header = parse_header(_write("r.hdr", raw))
    except InputError:
        return
    assert isinstance(header, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in header.items())


def test_envi_absurd_header_fails_before_mapping():
    hdr = _write("big.hdr", b"ENVI\nsamples = 100000000\nlines = 100000000\nbands = 100000\ndata type = 5\n")
    _write("big.img", bytes(64))
    with pytest.raises(InputError, match="truncated: expected 8000000000000000000000 bytes"):
        open_cube(hdr)


def test_envi_header_that_is_not_text_sized():
    hdr = _DIR / "huge.hdr"
    with open(hdr, "wb") as f:
        f.write(b"ENVI\n")
        f.truncate(64 << 20)  # sparse: no disk used
    with pytest.raises(InputError, match="too large for an ENVI header"):
        parse_header(hdr)


# -- format detection on arbitrary bytes -------------------------------------------------------------------

@FUZZ
@given(raw=st.binary(max_size=1024), suffix=st.sampled_from(SUFFIXES))
def test_random_bytes_any_suffix(raw, suffix):
    exercise(_write(f"any{suffix}", raw))


@FUZZ
@given(prefix=st.sampled_from([b"\x93NUMPY", b"II*\x00", b"MM\x00*", b"II+\x00", b"\x89HDF\r\n\x1a\n",
                               b"MATLAB 5.0 MAT-file", b"MATLAB 7.3 MAT-file", b"ENVI"]),
       rest=st.binary(max_size=512), suffix=st.sampled_from(SUFFIXES))
def test_signatures_followed_by_garbage(prefix, rest, suffix):
    exercise(_write(f"sig{suffix}", prefix + rest))


# -- .npy --------------------------------------------------------------------------------------------------

@FUZZ
@given(descr=st.sampled_from(["<i2", ">f4", "|u1", "<c8", "|O", "<U3", "V8", "<i2x", "[('a', '<i4')]"]),
       shape=st.lists(st.integers(-2, 2**40), max_size=4), fortran=st.booleans(), data=st.binary(max_size=256),
       version=st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]))
def test_npy_crafted_headers(descr, shape, fortran, data, version):
    header = f"{{'descr': {descr if descr.startswith('[') else repr(descr)}, 'fortran_order': {fortran}, " \
             f"'shape': {tuple(shape)!r}, }}"
    header = header.ljust(118) + "\n"
    prefix = b"\x93NUMPY" + bytes(version)
    length = struct.pack("<H" if version[0] == 1 else "<I", len(header))
    exercise(_write("c.npy", prefix + length + header.encode("latin-1") + data))


@FUZZ
@given(st.data())
def test_npy_mutated(data):
    buf = io.BytesIO()
    np.save(buf, np.arange(60, dtype=np.int16).reshape(5, 4, 3))
    exercise(_write("m.npy", _mutate(buf.getvalue(), data)))


def test_npy_absurd_shape_fails_before_allocating():
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000, 1000000), }".ljust(118) + "\n"
    path = _write("absurd.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(8))
    with pytest.raises(InputError, match="absurd.npy"):
        open_cube(path)


def test_npy_oversized_header_is_a_one_line_error():
    """A damaged header length (20854 bytes, past numpy's 10000-byte limit): numpy's refusal runs over three
    lines, which the CLI printed as they were (found by a corruption fuzz of hsgds convert)."""
    header = "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 2, 2), }".ljust(20853) + "\n"
    path = _write("long.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header.encode() + bytes(16))
    with pytest.raises(InputError, match=r"cannot read .*long.npy as .npy \(Header info length \(20854\) is large") \
            as caught:
        open_cube(path)
    assert "\n" not in str(caught.value)


# A library's message over several lines (numpy's and tifffile's can be) inside ours: kept on one line.
# No damaged file made one here (a few thousand corrupted TIFFs gave none), so the library call raises it.
_SEVERAL_LINES = "first line of the library's message\n  second line\nthird line"


def test_tiff_library_error_over_several_lines_is_one_line(monkeypatch):
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.zeros((4, 4, 3), np.uint16), photometric="minisblack", planarconfig="contig")
    path = _write("lines.tif", buf.getvalue())

    def refuse(*args, **kwargs):
        raise tifffile.TiffFileError(_SEVERAL_LINES)

    monkeypatch.setattr(tifffile, "TiffFile", refuse)
    with pytest.raises(InputError, match=r"cannot read .*lines.tif as TIFF \(first line of the library's message "
                                         r"second line third line\)") as caught:
        open_cube(path)
    assert "\n" not in str(caught.value)


def test_envi_mapping_error_over_several_lines_is_one_line(tmp_path, monkeypatch):
    from tests.envi import write_envi

    hdr = write_envi(tmp_path / "lines.hdr", np.zeros((4, 4, 3), np.int16))

    def refuse(*args, **kwargs):
        raise ValueError(_SEVERAL_LINES)

    monkeypatch.setattr(np, "memmap", refuse)
    with pytest.raises(InputError, match=r"cannot map ENVI data file .*lines.img \(first line of the library's "
                                         r"message second line third line\)") as caught:
        open_cube(hdr)
    assert "\n" not in str(caught.value)


def test_cube_read_error_over_several_lines_is_one_line(tmp_path):
    """A source array whose read fails (an h5py dataset on a damaged file) with a message of several lines."""

    class Failing:
        shape, dtype = (4, 4, 3), np.dtype(np.int16)

        def __getitem__(self, index):
            raise OSError(_SEVERAL_LINES)

    source = tmp_path / "lines.h5"
    source.write_bytes(bytes(8))  # (the cube checks that its file has not changed before each read)
    cube = reader_base.ArrayCube(Failing(), axes="HWB", files=[source])
    with pytest.raises(InputError, match=r"cannot read rows 0:2, columns 0:2 of .*lines.h5 \(OSError: first line "
                                         r"of the library's message second line third line\)") as caught:
        cube.read(0, 2, 0, 2)
    assert "\n" not in str(caught.value)


def test_npy_object_arrays_are_never_unpickled():
    buf = io.BytesIO()
    np.save(buf, np.array([[[object()]]], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="Python-object array"):
        open_cube(_write("obj.npy", buf.getvalue()))


# -- MATLAB (v4, v5 compressed and not, v7.3) ---------------------------------------------------------------

def _mat_seeds() -> list[bytes]:
    rng = np.random.default_rng(0)
    cube = rng.integers(0, 1000, (5, 4, 3)).astype(np.uint16)
    gt = rng.integers(0, 4, (5, 4)).astype(np.uint8)
    seeds = []
    for compress in (False, True):
        buf = io.BytesIO()
        scipy.io.savemat(buf, {"cube": cube, "gt": gt, "name": "text", "flags": gt > 1}, do_compression=compress)
        seeds.append(buf.getvalue())
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"gt": gt.astype(float)}, format="4")
    seeds.append(buf.getvalue())
    path = _DIR / "seed73.h5"
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("cube", data=cube.T, chunks=(1, 2, 2), compression="gzip")
        f["cube"].attrs["MATLAB_class"] = np.bytes_("uint16")
        f.create_dataset("gt", data=gt.T)
    raw = bytearray(path.read_bytes())
    raw[:19] = b"MATLAB 7.3 MAT-file"
    seeds.append(bytes(raw))
    return seeds


_MAT = _mat_seeds()


@FUZZ
@given(seed=st.integers(0, len(_MAT) - 1), key=st.sampled_from([None, "cube", "gt", "name", "nope"]),
       data=st.data())
def test_mat_mutated(seed, key, data):
    exercise(_write("m.mat", _mutate(_MAT[seed], data)), key=key)


def test_mat_v5_absurd_dimensions_fail_before_allocating():
    """A level-5 header with 2**31-1 x 2**31-1 doubles in a 200-byte file: refused from the element size."""
    raw = bytearray(_MAT[0])
    v5 = io.BytesIO()
    scipy.io.savemat(v5, {"a": np.zeros((2, 2))})
    raw = bytearray(v5.getvalue())
    dims_at = raw.index(struct.pack("<ii", 2, 2))
    raw[dims_at:dims_at + 8] = struct.pack("<ii", 2**31 - 1, 2**31 - 1)
    with pytest.raises(InputError, match=r"claims shape \(2147483647, 2147483647\)"):
        read_labels(_write("dims.mat", bytes(raw)))


def test_mat_v4_absurd_dimensions_fail_before_allocating():
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"gt": np.ones((3, 3))}, format="4")
    raw = bytearray(buf.getvalue())
    raw[4:12] = struct.pack("<ii", 100000, 100000)  # mrows, ncols of the first (only) matrix
    with pytest.raises(InputError, match=r"claims shape \(100000, 100000\)"):
        read_labels(_write("v4.mat", bytes(raw)))


def test_mat_whole_load_checked_against_memory(monkeypatch):
    monkeypatch.setattr(reader_base, "memory_budget", lambda: 100)
    with pytest.raises(InputError, match=r"needs 0.0 GiB in memory but only 0.0 GiB is available; save it with"):
        open_cube(_write("mem.mat", _MAT[1]), key="cube")


def test_mat_crash_regression():
    """A v5 file whose int16 matrix claims to be complex without an imaginary part: scipy's C parser
    segfaults on it (found by fuzz/fuzz_readers.py); the bounded parser reports it."""
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"cube": np.arange(60, dtype=np.int16).reshape(5, 4, 3)})
    raw = bytearray(buf.getvalue())
    flags_at = raw.index(struct.pack("<II", 6, 8)) + 8  # miUINT32 array-flags sub-element, then its data
    raw[flags_at + 1] |= 0x08  # the complex bit
    with pytest.raises(InputError, match="complex"):
        open_cube(_write("crash.mat", bytes(raw)))


# -- HDF5 ----------------------------------------------------------------------------------------------------

def _h5_seed() -> bytes:
    path = _DIR / "seed.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("cube", data=np.arange(60, dtype=np.int16).reshape(5, 4, 3), chunks=(2, 2, 3))
        f.create_group("grp").create_dataset("gt", data=np.ones((5, 4), np.uint8), compression="gzip")
    return path.read_bytes()


_H5 = _h5_seed()


@FUZZ
@given(key=st.sampled_from([None, "cube", "/grp/gt", "missing"]), data=st.data())
def test_hdf5_mutated(key, data):
    exercise(_write("m.h5", _mutate(_H5, data)), key=key)


def test_hdf5_huge_chunks_checked_against_memory(monkeypatch):
    path = _DIR / "chunky.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("cube", shape=(4096, 4096, 16), dtype=np.float64, chunks=(1024, 1024, 16))
    monkeypatch.setattr(reader_base, "memory_budget", lambda: 1 << 20)
    with pytest.raises(InputError, match="one chunk of dataset 'cube' in chunky.h5 needs"):
        open_cube(path)


# -- TIFF ----------------------------------------------------------------------------------------------------

def _tiff_seeds() -> list[bytes]:
    cube = np.arange(5 * 4 * 3, dtype=np.uint16).reshape(5, 4, 3)
    out = []
    for kwargs in ({"photometric": "rgb"}, {"planarconfig": "separate", "photometric": "minisblack"},
                   {"compression": "zlib", "photometric": "rgb"}):
        buf = io.BytesIO()
        tifffile.imwrite(buf, cube if "planarconfig" not in kwargs else cube.transpose(2, 0, 1), **kwargs)
        out.append(buf.getvalue())
    return out


_TIFF = _tiff_seeds()


@FUZZ
@given(seed=st.integers(0, len(_TIFF) - 1), data=st.data())
def test_tiff_mutated(seed, data):
    exercise(_write("m.tif", _mutate(_TIFF[seed], data)))


def test_tiff_ifd_loop_is_refused_quickly():
    """Two directories pointing at each other past the first hundred pages: tifffile would loop for ever."""
    raw = bytearray(b"II*\x00" + struct.pack("<I", 8))
    entry = struct.pack("<HHII", 256, 3, 1, 4)  # ImageWidth = 4 (one tag per directory)
    offsets = [8 + i * 18 for i in range(120)]
    for i in range(len(offsets)):
        nxt = offsets[i + 1] if i + 1 < len(offsets) else offsets[110]  # the tail loops back
        raw += struct.pack("<H", 1) + entry + struct.pack("<I", nxt)
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="loops back"):
        open_cube(_write("loop.tif", bytes(raw)))
    assert time.perf_counter() - t0 < 1


def test_tiff_strip_count_bomb_is_refused():
    """Image height 2**31 with one row per strip but three strips recorded: refused before decoding."""
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.zeros((4, 4, 3), np.uint16), photometric="rgb", compression="zlib", rowsperstrip=2)
    raw = bytearray(buf.getvalue())
    _patch_ifd(raw, {257: 2**31 - 1})  # ImageLength
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="bomb.tif"):
        open_cube(_write("bomb.tif", bytes(raw)))
    assert time.perf_counter() - t0 < 1


def _patch_ifd(raw: bytearray, values: dict[int, int]) -> None:
    """Set tags of the first IFD of a little-endian classic TIFF to LONG ``values``."""
    ifd = struct.unpack("<I", raw[4:8])[0]
    for i in range(struct.unpack("<H", raw[ifd:ifd + 2])[0]):
        at = ifd + 2 + 12 * i
        tag = struct.unpack("<H", raw[at:at + 2])[0]
        if tag in values:
            raw[at:at + 12] = struct.pack("<HHII", tag, 4, 1, values[tag])


def test_tiff_sparse_giant_is_refused_before_decoding():
    """One missing strip (0 bytes) of a 2**28-row image: tifffile would allocate and fill 1 GiB (then the
    label conversion 8 GiB) for a file of a few hundred bytes (found by fuzz/fuzz_readers.py)."""
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.ones((4, 4), np.uint8), compression="zlib", rowsperstrip=4)
    raw = bytearray(buf.getvalue())
    _patch_ifd(raw, {257: 2**28, 278: 2**28, 279: 0})  # ImageLength, RowsPerStrip, StripByteCounts
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=r"claims 1073741824 bytes of data but sparse.tif has only \d+ bytes"):
        read_labels(_write("sparse.tif", bytes(raw)))
    assert time.perf_counter() - t0 < 1


def test_tiff_giant_tile_is_refused_before_decoding():
    """TileWidth damaged to 2**31 - 16 in a small deflate-tiled image (one tile wide either way): tifffile decodes each
    tile whole, so it would allocate 16 x 2**31 x 12 uint16 samples (768 GiB) for one tile and raise MemoryError, a
    traceback (found by a corruption fuzz of hsgds convert). Strips are safe: tifffile clamps RowsPerStrip to the
    image."""
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.zeros((37, 12, 12), np.uint16), photometric="minisblack", planarconfig="contig",
                     compression="zlib", tile=(16, 16))
    raw = bytearray(buf.getvalue())
    _patch_ifd(raw, {322: 2**31 - 16})  # TileWidth
    with pytest.raises(InputError, match=r"one \(16, 2147483632, 12\) strip/tile of giant.tif \(decoded whole\) "
                                         r"needs 768.0 GiB in memory"):
        open_cube(_write("giant.tif", bytes(raw)))
