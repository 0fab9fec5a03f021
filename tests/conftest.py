"""Shared fixtures: the real Indian Pines store, small synthetic scenes, the CLI, GPU skipping."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

# libcufile (pulled in by kvikio) writes cufile.log into the working directory unless told otherwise
os.environ.setdefault("CUFILE_LOGFILE_PATH", "/tmp/hsgds-cufile.log")


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


_COMPILER = pytest.StashKey[subprocess.Popen]()
_COMPILE = """
import os, sys
if hasattr(os, "nice"):
    os.nice(10)  # spare cycles only: the tests keep the cores they ask for
import numpy as np
from hsgds.engines import cpu_cut
for pair in sys.argv[1:]:
    store, out, normalized = pair.split(":")
    cpu_cut._warm(np.dtype(store), out, normalized == "normalized")
"""


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist (the GPU check's image) runs the suite too
def pytest_xdist_auto_num_workers(config):
    """``pytest -n auto`` (``make test``): one test process per usable core, at most 4 (each imports torch
    and compiles its own kernels)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


def pytest_collection_finish(session):
    """When the engine tests are to run: compile the fused CPU kernel's specializations they use in a
    background process, into numba's on-disk cache. numba compiles one at a time per process (6-10 s each on
    the 2-core CI machine, 26 of them, and 2-5 s for each of the 6 pairs of normalized tiles): with a cold cache the tests would wait minutes for them, while time
    is left on the cores whenever a test waits for a subprocess or a sleep. The tests load from the cache
    what is already there and compile the rest themselves (numba replaces its cache files whole: at worst
    one is compiled twice); a warm cache costs the background process a few seconds. It is stopped at the
    end of the session. Under pytest-xdist only the first worker starts it: one is enough for all."""
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    if importlib.util.find_spec("numba") is None or not any(
            item.nodeid.startswith("tests/engines/") for item in session.items):
        return
    from tests.engines.kernel_pairs import CUT_PAIRS, NORMALIZED_PAIRS

    pairs = [f"{store}:{out}:raw" for store, out in CUT_PAIRS]
    pairs += [f"{store}:{out}:normalized" for store, out in NORMALIZED_PAIRS]
    session.config.stash[_COMPILER] = subprocess.Popen([sys.executable, "-c", _COMPILE, *pairs],
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionfinish(session):
    proc = session.config.stash.get(_COMPILER, None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA driver and GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def indian_pines_store(tmp_path_factory):
    """The real Indian Pines scene (tensorly wheel) converted once per test session (random 10% split)."""
    from hsgds.datasets import INDIAN_PINES_CLASSES, indian_pines_files
    from hsgds.preprocess.convert import ConvertOptions, convert

    cube, gt = indian_pines_files()
    out = tmp_path_factory.mktemp("ip") / "indian_pines.zarr"
    return convert(cube, out, ConvertOptions(labels=gt, class_names=INDIAN_PINES_CLASSES))


@pytest.fixture(scope="session")
def indian_pines_arrays():
    from hsgds.datasets import indian_pines_files

    cube, gt = indian_pines_files()
    return np.load(cube), np.load(gt)


@pytest.fixture
def run_cli(capsys):
    """Run the real ``hsgds`` entry point in-process; returns (exit code, stdout, stderr)."""
    from hsgds.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        code = 0
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def convert_quietly(*args, **kwargs):
    """``convert`` for fixtures of small seeded scenes, whose few-pixel classes make the split warn (a class
    missing from some split, a block share off its target): tests/preprocess/test_splits.py checks those
    warnings; here they are not what is tested."""
    import warnings

    from hsgds.preprocess.convert import convert
    from hsgds.preprocess.splits import TrainShareWarning, UnsplittableClassWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsplittableClassWarning)
        warnings.simplefilter("ignore", TrainShareWarning)
        return convert(*args, **kwargs)


@pytest.fixture(scope="session")
def synthetic_store(tmp_path_factory):
    """``synthetic_store(h, w, bands, classes=, seed=, dtype=, labelled_fraction=, split_seed=, **convert
    options)``: a seeded synthetic scene written as .npy and converted into a store (``seed`` makes the
    scene, ``split_seed`` is the converter's ``seed``); returns (store path, cube, labels). Module fixtures
    call it once, so each module gets its own store."""
    from hsgds.preprocess.convert import ConvertOptions
    from hsgds.synthetic import make_scene

    def make(h: int, w: int, bands: int, *, classes: int, seed: int, dtype: str = "int16",
             labelled_fraction: float | None = None, split_seed: int | None = None, **options):
        d = tmp_path_factory.mktemp("store")
        extra = {} if labelled_fraction is None else {"labelled_fraction": labelled_fraction}
        cube, labels = make_scene(h, w, bands, classes=classes, dtype=dtype, seed=seed, **extra)
        np.save(d / "cube.npy", cube)
        np.save(d / "gt.npy", labels)
        if split_seed is not None:
            options["seed"] = split_seed
        store = convert_quietly(d / "cube.npy", d / "s.zarr", ConvertOptions(labels=d / "gt.npy", **options))
        return store, cube, labels

    return make


def swath_nodata(h: int, w: int, seed: int = 0, tile: int | None = None) -> np.ndarray:
    """(H, W) bool: where a rotated flight line's raster has no data (the corners outside a slanted swath),
    plus a few isolated pixels and, with ``tile``, the whole first tile."""
    yy, xx = np.mgrid[:h, :w]
    mask = np.abs((yy - h / 2) * 0.8 - (xx - w / 2) * 0.6) > 0.3 * min(h, w)
    rng = np.random.default_rng(seed)
    mask[rng.integers(0, h, 5), rng.integers(0, w, 5)] = True
    if tile is not None:
        mask[:tile, :tile] = True
    return mask


@pytest.fixture(scope="session")
def nodata_store(tmp_path_factory):
    """``nodata_store(h, w, bands, *, seed=, tile=, max_patch=, train=, nodata=, scene=)``: a store converted
    from a source with no data at some pixels (every band -9999, or the dtype's largest value if unsigned;
    ``--nodata`` that value); returns (store path, cube as the tiles hold it (nodata pixels filled), labels,
    nodata (H, W) bool). ``nodata`` defaults to :func:`swath_nodata` (with the whole first tile); ``scene``:
    (cube, labels) to convert instead of a synthetic scene. Labels are cleared at nodata pixels first (the
    converter would drop them with a warning; tests/preprocess/test_nodata.py checks that)."""
    from hsgds.preprocess.convert import ConvertOptions
    from hsgds.scene import open_scene
    from hsgds.synthetic import make_scene

    def make(h: int, w: int, bands: int, *, seed: int = 0, tile: int = 28, max_patch: int = 5,
             train: float = 0.5, nodata: np.ndarray | None = None, scene: tuple | None = None, **options):
        d = tmp_path_factory.mktemp("nodata")
        cube, labels = make_scene(h, w, bands, classes=3, seed=seed) if scene is None else (scene[0], scene[1].copy())
        mask = swath_nodata(h, w, seed, tile) if nodata is None else nodata
        value = np.iinfo(cube.dtype).max if cube.dtype.kind == "u" else -9999
        source = cube.copy()
        source[mask] = value
        assert np.array_equal((source == value).all(axis=-1), mask), "a data pixel holds the nodata value"
        labels[mask] = 0
        np.save(d / "cube.npy", source)
        np.save(d / "gt.npy", labels)
        store = convert_quietly(d / "cube.npy", d / "s.zarr", ConvertOptions(labels=d / "gt.npy", tile=tile,
                                                                     max_patch=max_patch, train=train, seed=seed,
                                                                     nodata=float(value), **options))
        held = source.copy()
        if mask.any():
            mean = open_scene(store).norm_stats.mean
            held[mask] = mean.astype(cube.dtype) if cube.dtype.kind == "f" else np.rint(mean).astype(cube.dtype)
        return store, held, labels, mask

    return make


@pytest.fixture
def npy_scene(tmp_path):
    """Write a small seeded synthetic scene as .npy files; returns (cube path, labels path, cube, labels)."""

    def make(h=37, w=29, b=6, dtype="int16", seed=0, fortran=False, classes=5):
        from hsgds.synthetic import make_scene

        cube, labels = make_scene(h, w, b, classes=classes, dtype=dtype, seed=seed)
        if fortran:
            cube = np.asfortranarray(cube)
        cp, lp = tmp_path / f"cube{seed}.npy", tmp_path / f"gt{seed}.npy"
        np.save(cp, cube)
        np.save(lp, labels)
        return cp, lp, cube, labels

    return make




@pytest.fixture
def hsgds_env(monkeypatch):
    """``hsgds_env(var, value)`` sets (or with None unsets) an ``HSGDS_*`` variable for one test.
    hsgds.defaults reads each variable once, so what it read is forgotten now and after the test (when
    monkeypatch has put the environment back)."""
    from hsgds import defaults

    def change(var: str, value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
        defaults.reload()

    yield change
    defaults.reload()


def _convert_synthetic(root, h, w, b, dtype, tile, max_patch, sparse_labels=False, seed=0):
    """Convert a seeded synthetic cube with the real converter; returns the store path."""
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    if sparse_labels:  # random bytes, one labelled pixel per tile: an epoch reads every tile once, quickly
        rng = np.random.default_rng(seed)
        cube = rng.integers(0, 256, (h, w, b), dtype=np.uint8).astype(dtype)
        labels = np.zeros((h, w), dtype=np.int32)
        labels[tile // 2::tile, tile // 2::tile] = rng.integers(1, 4, labels[tile // 2::tile, tile // 2::tile].shape)
    else:
        cube, labels = make_scene(h, w, b, classes=3, dtype=dtype, seed=seed)
    np.save(root / "cube.npy", cube)
    np.save(root / "gt.npy", labels)
    return convert(root / "cube.npy", root / "store.zarr",
                   ConvertOptions(labels=root / "gt.npy", max_patch=max_patch, tile=tile, train=0.5, seed=seed))


@pytest.fixture(scope="session")
def tile_store(tmp_path_factory):
    """A small int16 store of 12 tiles of 4 KiB (16 x 16 x 8, halo 2) from the real converter. Read-only:
    tests that damage tiles copy it first."""
    return _convert_synthetic(tmp_path_factory.mktemp("tiles12"), 40, 36, 8, "int16", tile=12, max_patch=5)


@pytest.fixture(scope="session")
def many_tiles_store(tmp_path_factory):
    """A store of 2,025 tiny tiles (45 x 45 tiles of 16 x 16 x 16 uint8 = 4 KiB) with one labelled pixel
    per tile: an epoch reads every tile once (open-file limits at any tile count)."""
    return _convert_synthetic(tmp_path_factory.mktemp("tiles2k"), 540, 540, 16, "uint8", tile=12, max_patch=5,
                              sparse_labels=True)


@pytest.fixture(scope="session")
def zarr_tile():
    """The bytes of one tile as zarr-python reads them (the independent reference for every reader)."""
    import zarr

    from hsgds.scene import open_scene

    def read(store, tile_id: int) -> bytes:
        ntx = open_scene(store).grid.ntx
        arr = zarr.open_array(str(store / "tiles"), mode="r")
        return np.ascontiguousarray(arr[tile_id // ntx, tile_id % ntx]).tobytes()

    return read
