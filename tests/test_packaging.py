"""Packaging, offline: the extras' contents and platform markers, the checks of .ci/check_extras.py (which
resolves the extras for real with `pip install --dry-run` in CI), and the extras that error messages name."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ce():
    pytest.importorskip("packaging")
    spec = importlib.util.spec_from_file_location("check_extras", ROOT / ".ci" / "check_extras.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.load_project()
    except ModuleNotFoundError:
        pytest.skip("needs tomllib (Python >= 3.11) or tomli")
    return module


def names(reqs) -> set[str]:
    from packaging.utils import canonicalize_name

    return {canonicalize_name(r.name) for r in reqs}


@pytest.mark.parametrize("extra", ["cu12", "cu13"])
def test_gpu_extras_bring_kvikio_dali_on_linux_and_no_cuda_library_on_windows(ce, extra):
    extras = ce.load_extras()
    on_linux = names(ce.requirements_on(extra, extras, "linux"))
    assert ce.EXPECTED[extra] <= on_linux
    on_windows = names(ce.requirements_on(extra, extras, "win32"))
    assert not [n for n in on_windows if n.startswith(ce.LINUX_ONLY)]
    # nothing in hsgds uses CuPy (README, Install): the extras do not ask for it on any platform
    assert not [n for n in on_linux | on_windows if n.startswith("cupy")]


def test_cpu_extra_is_numba_alone_and_dali_is_its_own_extra_on_linux_only(ce):
    """[cpu] brings the fused kernel without DALI's ~190 MiB (the CPU path's engine is torch); [dali] brings
    DALI's CPU pipelines, on Linux only."""
    extras = ce.load_extras()
    assert names(ce.requirements_on("cpu", extras, "linux")) == {"numba"}
    assert "nvidia-dali-cuda130" in names(ce.requirements_on("dali", extras, "linux"))
    assert "nvidia-dali-cuda130" not in names(ce.requirements_on("dali", extras, "win32"))


def test_unmarked_linux_only_package_is_caught(ce):
    extras = {"cu13": ["kvikio-cu13", "cupy-cuda13x"]}  # what pyproject had before the markers
    assert "kvikio-cu13" in names(ce.requirements_on("cu13", extras, "win32"))
    with_base = ce.requirements_on("cu13", extras, "win32", base=["numpy>=1.24", "pywin32; sys_platform == 'linux'"])
    assert names(with_base) == {"numpy", "kvikio-cu13", "cupy-cuda13x"}


def test_ecosystem_extras(ce):
    extras = ce.load_extras()
    assert "matplotlib" in names(ce.requirements_on("preview", extras, "linux"))
    assert "xarray" in names(ce.requirements_on("xarray", extras, "linux"))
    assert {"matplotlib", "xarray", "pyyaml", "pytest"} <= names(ce.requirements_on("test", extras, "linux"))


def test_geo_extra_decodes_compressed_geotiffs_and_the_tests_have_it(ce):
    """[geo] brings imagecodecs beside rasterio: tifffile decodes LZW (GDAL's COG default), JPEG, ZSTD and the
    floating-point predictor only with it, and the TIFF reader's error names [geo] for them; [test] has all of
    [geo], so CI decodes them."""
    extras = ce.load_extras()
    for platform in ("linux", "win32"):
        geo = names(ce.requirements_on("geo", extras, platform))
        assert geo == {"rasterio", "imagecodecs"}
        assert geo <= names(ce.requirements_on("test", extras, platform))


def test_check_plan(ce):
    def item(name, version="1.0", url="https://files.example/x.whl", local=False):
        info = {"url": url, "dir_info": {}} if local else {"url": url, "archive_info": {}}
        return {"metadata": {"name": name, "version": version}, "download_info": info}

    good = {"install": [item("hsgds", url="file:///src/hsgds", local=True), item("kvikio-cu13"),
                        item("CuPy-CUDA13x"), item("nvidia_dali_cuda130")]}
    assert ce.check_plan(good, ce.EXPECTED["cu13"] | {"hsgds"}) == []
    from_index = {"install": [item("hsgds")]}
    assert ce.check_plan(from_index, {"hsgds"}) == ["hsgds would come from https://files.example/x.whl, "
                                                     "not from this checkout"]
    missing = {"install": [item("cupy-cuda13x")]}
    assert ce.check_plan(missing, {"kvikio-cu13", "cupy-cuda13x"}) == ["kvikio-cu13 is not in the plan"]
    assert ce.check_plan(good, set(), ce.LINUX_ONLY) == ["kvikio-cu13 1.0 would be installed",
                                                         "nvidia-dali-cuda130 1.0 would be installed"]


def test_docker_torch_version_is_read(ce):
    assert re.fullmatch(r"\d+\.\d+\.\d+", ce.docker_torch_version())


def test_extras_named_in_messages_exist(ce):
    """Every `hsgds[NAME]` a message tells users to install, and every extra passed to
    hsgds._optional.require() or pip_install(), in the runtime and the converter, is an extra of pyproject.toml."""
    extras = set(ce.load_extras())
    named = set()
    for path in [*(ROOT / "hsgds").rglob("*.py"), *(ROOT / "preprocess").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        named |= set(re.findall(r"hsgds\[(\w+)\]", text)) - {"extra"}  # _optional's docstring
        named |= set(re.findall(r"require\(\s*\"[\w.]+\",\s*\"(\w+)\"", text))
        named |= set(re.findall(r"pip_install\(\s*[\"'](\w+)[\"']\)", text))  # the hint _optional makes
    assert {"cpu", "cu13", "preview", "xarray", "geo", "dask"} <= named
    assert named <= extras, f"messages name extras that do not exist: {sorted(named - extras)}"


def test_install_hints_quote_the_extra_for_every_shell():
    """An install hint in a message or a doc is pasted into whatever shell the user has: single quotes, as in
    pip install 'hsgds[geo]', reach pip as part of the name in Windows cmd.exe (docs/windows.md), while double
    quotes keep the brackets from the shell in bash, zsh, PowerShell and cmd.exe alike. hsgds._optional makes
    the hint the messages give; no code or doc writes one with single quotes."""
    from hsgds._optional import cuda_extra, pip_install

    assert pip_install("geo") == 'pip install "hsgds[geo]"' and cuda_extra("12.4") == 'pip install "hsgds[cu12]"'
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"]
    texts += [p for folder in ("hsgds", "preprocess", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    single = [f"{p.relative_to(ROOT)}:{i}" for p in texts
              for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
              if re.search(r"pip install (-e )?'|`'\.\[", line)]
    assert not single, f"install hints in single quotes (cmd.exe keeps them): {single}"


def test_converter_is_installed_as_hsgds_preprocess(tmp_path):
    """The wheel holds the converter as hsgds/preprocess/ and no top-level `preprocess` package (PyPI has an
    unrelated one), and every package folder of the checkout is in the wheel."""
    import shutil
    import subprocess
    import sys
    import zipfile

    # built from a copy: setuptools writes build/ and *.egg-info into the source folder, and a stale build/lib
    # there could carry deleted modules into the wheel
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("hsgds", "preprocess"):
        shutil.copytree(ROOT / name, src / name, ignore=skip, symlinks=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = tmp_path.glob("hsgds-*.whl")
    files = set(zipfile.ZipFile(wheel).namelist())
    assert "hsgds/preprocess/convert.py" in files
    assert "hsgds/preprocess/readers/envi.py" in files
    assert not [f for f in files if f.startswith("preprocess/")]
    expected = {f"hsgds/{p.relative_to(ROOT / 'hsgds').as_posix()}" for p in (ROOT / "hsgds").rglob("*.py")}
    expected |= {f"hsgds/preprocess/{p.relative_to(ROOT / 'preprocess').as_posix()}"
                 for p in (ROOT / "preprocess").rglob("*.py")}
    assert expected <= files, f"missing from the wheel (add the package to pyproject): {sorted(expected - files)}"


def test_the_suite_runs_without_pytest_xdist():
    """``make test`` uses pytest-xdist, but the GPU check's image runs ``pytest -m gpu`` without it: the
    suite's conftest must load there (an xdist hook that pytest does not know is an internal error)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "tests/test_lru.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_commands_on_a_base_install_without_torch_say_so_in_one_line(tmp_path):
    """The base install leaves torch out (README, Install: its build must match the CUDA). `hsgds convert` computes
    the tiles' wsum64 checksum with torch, and predict, bench and demo train or run models: each ended in a
    ModuleNotFoundError traceback; now one line names PyTorch and how to install it, and nothing is written."""
    cube = np.random.default_rng(0).integers(0, 1000, (9, 8, 3), dtype=np.int16)
    np.save(tmp_path / "c.npy", cube)
    for args in (["convert", "c.npy", "-o", "c.zarr"], ["bench", "c.zarr"], ["predict", "c.zarr", "--model", "m.pt2",
                                                                             "-o", "m.npy"]):
        script = ("import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
                  f"from hsgds.cli import main\nmain({args!r})")
        run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1, (args, run.stderr[-2000:])
        assert lines[0].startswith("hsgds: error: this command needs PyTorch, which is not installed") and \
            'pip install "hsgds[torch]"' in lines[0], lines
        if args[0] == "convert":
            assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]  # no store, no temporary folder
            (tmp_path / "c.zarr").mkdir()  # for the next commands: they fail on torch before they read it
    # a module other than torch missing is not reported as torch
    script = "import sys; sys.modules['zarr'] = None\nfrom hsgds.cli import main\nmain(['info', 'c.npy'])"
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "PyTorch" not in run.stderr


def test_doctor_on_a_base_install_without_torch_reports_the_machine(tmp_path):
    """`hsgds doctor` is what a user runs to learn what is missing, and the README's list of commands that need
    torch leaves it out: without torch it reports torch as not importable, says why the CPU cut cannot run and
    what hsgds would pick (its CPU cut line imported the engines, which need torch: a one-line error instead)."""
    script = ("import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
              "from hsgds.cli import main\nmain(['doctor'])")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert "  torch         not importable" in lines, run.stdout
    (cut,) = [line for line in lines if line.startswith("  CPU cut ")]
    assert cut.split()[2] == "no" and "PyTorch" in cut and 'pip install "hsgds[torch]"' in cut, cut
    assert "would use: device=cpu reader=posix engine=torch" in lines, run.stdout


def test_a_missing_torch_submodule_with_torch_installed_is_not_called_torch_not_installed(tmp_path):
    """With torch installed, a ModuleNotFoundError for one of its submodules (a torch build that lacks it, an
    hsgds bug naming a wrong module) is not "PyTorch, which is not installed": that would send the user to
    install what they have. The error is shown as raised (its traceback names the module)."""
    import importlib.util

    assert importlib.util.find_spec("torch") is not None  # the suite's environment has torch
    script = ("import hsgds.cli as c\n"
              "def broken(*a, **k):\n    import torch.hsgds_no_such_module\n"
              "c.cli.main = broken\nc.main(['info', 'x'])")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "PyTorch" not in run.stderr
    assert "No module named 'torch.hsgds_no_such_module'" in run.stderr.strip().splitlines()[-1]
