"""Shared fixtures: the real Indian Pines store, small synthetic scenes, the CLI, GPU skipping."""

from __future__ import annotations

import os

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
