"""Coverage-guided fuzzing of the source readers with atheris (not run in CI).

Every input is written to a scratch file and handed to the real entry points (``detect_format``,
``open_cube``, ``read_labels``, a window read). The only acceptable outcomes are success or an
``hsgds.errors.HsgdsError``; anything else (another exception type, a hang past ``-timeout``, a
memory blow-up past the address-space limit) is a finding.

Usage (one parser per run; extra arguments go to libFuzzer)::

    pip install atheris
    python fuzz/fuzz_readers.py envi -runs=100000
    python fuzz/fuzz_readers.py npy -runs=100000 -timeout=10
    python fuzz/fuzz_readers.py all -runs=100000          # every target in turn, summary as JSON

Targets: envi (header parser + header/binary validation), npy, mat (v4/v5/v7.3 detection and
variable selection), hdf5 (detection and dataset selection), tiff, detect (format detection of
arbitrary bytes under every supported suffix). Each starts from a seed corpus of small valid files
written by the reference libraries, so mutations explore past the signatures.

``--keep-going`` logs each distinct unexpected exception once and continues (to collect several
findings in one run); without it the first one stops the run with its traceback, as libFuzzer expects.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports(include=["hsgds.preprocess", "hsgds.errors", "tifffile", "scipy.io.matlab",
                                         "numpy.lib.format", "numpy.lib._format_impl"]):
    import numpy as np

    from hsgds.errors import HsgdsError
    from hsgds.preprocess.readers import detect_format, open_cube, read_labels
    from hsgds.preprocess.readers.envi import parse_header

TARGETS = ("envi", "npy", "mat", "hdf5", "tiff", "detect")
SUFFIXES = (".npy", ".tif", ".tiff", ".h5", ".hdf5", ".mat", ".hdr", ".img", ".dat", "")
#: address-space cap: an allocation sized by a header value fails with MemoryError (a finding)
#: instead of swapping the machine
ADDRESS_SPACE = 6 << 30

# libFuzzer ends the process from C, so atexit may not run: `all` gives each target a folder it removes itself
_scratch = Path(os.environ.get("HSGDS_FUZZ_SCRATCH") or tempfile.mkdtemp(
    prefix="hsgds-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
_scratch.mkdir(parents=True, exist_ok=True)
atexit.register(shutil.rmtree, _scratch, True)
_seen: set[str] = set()
_keep_going = False
_findings: list[dict] = []


def _write(name: str, data: bytes) -> Path:
    path = _scratch / name
    path.write_bytes(data)
    return path


def _exercise(path: Path, key: str | None = None) -> None:
    """The reader entry points the converter uses, on one file."""
    detect_format(path)
    try:
        cube = open_cube(path, key=key)
    except HsgdsError:
        pass
    else:
        try:
            h, w, _ = cube.shape
            cube.read(0, min(h, 3), 0, min(w, 3))
            cube.read(h - 1, h, w - 1, w)
        finally:
            cube.close()
    try:
        read_labels(path, key=key)
    except HsgdsError:
        pass


def _finding(exc: BaseException) -> None:
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename.split('/site-packages/')[-1]}:{f.lineno}" for f in reversed(tb)), "?")
    signature = f"{type(exc).__name__} at {where}"
    if signature not in _seen:
        _seen.add(signature)
        _findings.append({"signature": signature, "message": str(exc)[:300]})
        print(f"\nFINDING {signature}: {str(exc)[:300]}", file=sys.stderr, flush=True)
        traceback.print_exception(exc, file=sys.stderr)


def _guard(fn):
    def run(data: bytes) -> None:
        try:
            fn(data)
        except HsgdsError:
            pass
        except Exception as exc:  # noqa: BLE001 - anything else is what we are looking for
            if not _keep_going:
                raise
            _finding(exc)
    return run


@_guard
def fuzz_envi(data: bytes) -> None:
    """Bytes 0-1: size of the binary (0..65535); byte 2: which file is passed; the rest: the header."""
    if len(data) < 3:
        return
    size = int.from_bytes(data[:2], "little")
    header = data[3:]
    hdr = _write("cube.hdr", header)
    binary = _write("cube.img", bytes(size))
    try:
        parse_header(hdr)
    except HsgdsError:
        pass
    _exercise(binary if data[2] & 1 else hdr)


@_guard
def fuzz_npy(data: bytes) -> None:
    _exercise(_write("cube.npy", data))


@_guard
def fuzz_mat(data: bytes) -> None:
    """Byte 0 picks the --key (none or one of the names the seeds use); the rest is the file."""
    if not data:
        return
    keys = (None, "cube", "gt", "a", "x/y")
    _exercise(_write("cube.mat", data[1:]), key=keys[data[0] % len(keys)])


@_guard
def fuzz_hdf5(data: bytes) -> None:
    if not data:
        return
    keys = (None, "cube", "/grp/cube", "gt", "data")
    _exercise(_write("cube.h5", data[1:]), key=keys[data[0] % len(keys)])


@_guard
def fuzz_tiff(data: bytes) -> None:
    _exercise(_write("cube.tif", data))


@_guard
def fuzz_detect(data: bytes) -> None:
    """Byte 0 picks the file name's suffix; the rest is the file."""
    if not data:
        return
    suffix = SUFFIXES[data[0] % len(SUFFIXES)]
    path = _write(f"any{suffix}", data[1:])
    try:
        _exercise(path)
    finally:
        path.unlink()


FUNCS = {"envi": fuzz_envi, "npy": fuzz_npy, "mat": fuzz_mat, "hdf5": fuzz_hdf5, "tiff": fuzz_tiff,
         "detect": fuzz_detect}


# -- seed corpora: small valid files from the reference libraries --------------------------------------

def _seeds(target: str, folder: Path) -> None:
    import h5py
    import scipy.io
    import tifffile

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    cube = rng.integers(0, 1000, (5, 4, 3)).astype(np.int16)
    gt = rng.integers(0, 4, (5, 4)).astype(np.uint8)

    def npy_bytes(a: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    out: dict[str, bytes] = {}
    if target in ("npy", "detect"):
        out["c.npy"] = npy_bytes(cube)
        out["f.npy"] = npy_bytes(np.asfortranarray(cube.astype(">f4")))
        out["g.npy"] = npy_bytes(gt)
    if target == "envi":
        for i, (interleave, code, order) in enumerate((("bsq", 2, 0), ("bil", 4, 1), ("bip", 12, 0))):
            text = (f"ENVI\ndescription = {{seed {i}}}\nsamples = 4\nlines = 5\nbands = 3\nheader offset = 0\n"
                    f"file type = ENVI Standard\ndata type = {code}\ninterleave = {interleave}\n"
                    f"byte order = {order}\nwavelength units = Micrometers\n"
                    "wavelength = {0.45, 0.55,\n 0.65}\nband names = {a, b, c}\n")
            nbytes = 5 * 4 * 3 * (2 if code in (2, 12) else 4)
            out[f"e{i}"] = nbytes.to_bytes(2, "little") + bytes([i]) + text.encode()
    if target in ("mat", "detect"):
        for name, variables in (("v5", {"cube": cube, "gt": gt}), ("v5c", {"cube": cube.astype(float)})):
            buf = io.BytesIO()
            scipy.io.savemat(buf, variables, do_compression=name.endswith("c"))
            out[name] = (b"\x00" if target == "mat" else bytes([SUFFIXES.index(".mat")])) + buf.getvalue()
        buf = io.BytesIO()
        scipy.io.savemat(buf, {"gt": gt.astype(float)}, format="4")
        out["v4"] = (b"\x00" if target == "mat" else bytes([SUFFIXES.index(".mat")])) + buf.getvalue()
    if target in ("mat", "hdf5", "detect"):
        path = _scratch / "seed.h5"
        ub = 512 if target == "mat" else 0
        with h5py.File(path, "w", userblock_size=ub or None) as f:
            f.create_dataset("cube", data=cube.T if ub else cube, chunks=(1, 2, 2))
            g = f.create_group("grp")
            g.create_dataset("gt", data=gt, compression="gzip")
            if ub:
                f["cube"].attrs["MATLAB_class"] = np.bytes_("int16")
        raw = path.read_bytes()
        if ub:
            raw = b"MATLAB 7.3 MAT-file" + raw[19:]
        prefix = b"\x00" if target != "detect" else bytes([SUFFIXES.index(".mat" if ub else ".h5")])
        out["h5"] = prefix + raw
        path.unlink()
    if target in ("tiff", "detect"):
        for name, kwargs in (("contig", {"photometric": "rgb"}),
                             ("planar", {"planarconfig": "separate", "photometric": "minisblack"}),
                             ("zlib", {"compression": "zlib", "photometric": "rgb"})):
            buf = io.BytesIO()
            tifffile.imwrite(buf, cube if name != "planar" else cube.transpose(2, 0, 1), **kwargs)
            out[name] = (b"" if target == "tiff" else bytes([SUFFIXES.index(".tif")])) + buf.getvalue()
        buf = io.BytesIO()
        tifffile.imwrite(buf, gt)
        out["gt"] = (b"" if target == "tiff" else bytes([SUFFIXES.index(".tif")])) + buf.getvalue()
    for name, data in out.items():
        (folder / name).write_bytes(data)


def _run_one(target: str, libfuzzer_args: list[str]) -> None:
    global _keep_going
    _keep_going = "--keep-going" in libfuzzer_args
    args = [a for a in libfuzzer_args if a != "--keep-going"]
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, hard))
    corpus = _scratch / f"corpus-{target}"
    _seeds(target, corpus)
    atheris.Setup([sys.argv[0], *args, str(corpus)], FUNCS[target])
    atheris.Fuzz()


def _run_all(libfuzzer_args: list[str]) -> None:
    """Each target in its own process (libFuzzer exits at the end of a run); prints a JSON summary."""
    summary = {}
    for target in TARGETS:
        t0 = time.perf_counter()
        scratch = tempfile.mkdtemp(prefix=f"hsgds-fuzz-{target}-", dir=_scratch.parent)
        try:
            proc = subprocess.run([sys.executable, __file__, target, *libfuzzer_args], capture_output=True, text=True,
                                  env={**os.environ, "HSGDS_FUZZ_SCRATCH": scratch})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        elapsed = time.perf_counter() - t0
        done = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
        final = [line for line in proc.stderr.splitlines() if "\tDONE " in line]
        findings = [line for line in proc.stderr.splitlines() if line.startswith("FINDING")]
        summary[target] = {"returncode": proc.returncode, "libfuzzer": done[-1] if done else None,
                           "coverage": final[-1].split("DONE", 1)[1].strip() if final else None,
                           "seconds": round(elapsed, 1), "findings": findings}
        if proc.returncode != 0:
            summary[target]["tail"] = proc.stderr[-3000:]
        print(json.dumps({target: summary[target]}), flush=True)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in (*TARGETS, "all"):
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)},all}} [--keep-going] [libFuzzer args]")
    target, rest = sys.argv[1], sys.argv[2:]
    if target == "all":
        _run_all(rest)
    else:
        _run_one(target, rest)
