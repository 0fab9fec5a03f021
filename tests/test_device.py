"""hsgds.probe / hsgds.choice / hsgds.doctor on the CPU, and the probe on a GPU (``-m gpu``). The readers'
tests are in tests/io/."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hsgds import defaults
from hsgds._optional import cuda_extra
from hsgds.choice import AUTO_ENGINE, Choice, choose
from hsgds.doctor import doctor_report
from hsgds.errors import ConfigError, DependencyError
from hsgds.probe import DeviceReport, probe


@pytest.fixture(autouse=True)
def fresh_probe():
    """probe() caches its report per process; these tests change the machine under it."""
    import hsgds.probe

    hsgds.probe._cached.clear()
    yield
    hsgds.probe._cached.clear()


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


requires_cuda = pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA driver and GPU")
no_cuda_here = pytest.mark.skipif(_cuda_available(), reason="asserts the no-CUDA path; this machine has CUDA")

# a GPU machine by hand: CUDA 13 with kvikio usable in compat mode, no DALI
GPU = DeviceReport(cuda=True, cuda_reason="", cuda_runtime="13.0", cuda_driver="13.0", device_count=1,
                   device_name="NVIDIA H200", compute_capability="9.0", torch_version="2.11.0+cu130",
                   kvikio_version="26.10.00", kvikio_usable=True, kvikio_reason="", compat_mode="AUTO",
                   gds=False, gds_reason="the nvidia-fs kernel module is not loaded",
                   dali_reason="not installed")
CPU = DeviceReport(cuda=False, cuda_reason="torch 2.13.0+cpu is a CPU-only build", torch_version="2.13.0+cpu",
                   kvikio_reason="kvikio is not installed", gds_reason="kvikio not usable",
                   dali_reason="not installed")


# ------------------------------------------------------------------------------------------ probe

def test_import_is_light():
    code = ("import sys, hsgds.probe, hsgds.choice, hsgds.doctor, hsgds.io.kvikio_reader; "
            "print([m for m in ('torch', 'kvikio', 'cupy', 'nvidia.dali') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])})
    assert out.stdout.strip() == "[]"



def test_documented_submodules_are_reachable_after_a_plain_import():
    """The README calls hsgds.models.save_program(...) after `import hsgds`; loading them stays lazy."""
    code = ("import sys, hsgds; light = 'hsgds.models' not in sys.modules and 'torch' not in sys.modules; "
            "f = hsgds.models.save_program; r = hsgds.io.READERS\n"
            "try:\n    hsgds.nonsense\nexcept AttributeError as e:\n    print(light, f.__name__, sorted(r), e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])})
    assert out.stdout.strip() == ("True save_program ['kvikio', 'posix', 'posix-pinned'] "
                                  "module 'hsgds' has no attribute 'nonsense'"), out.stderr

@no_cuda_here
def test_probe_never_raises_and_reports_no_cuda():
    report = probe()
    assert isinstance(report, DeviceReport)
    assert not report.cuda and report.cuda_reason
    assert report.device_count == 0
    assert not report.kvikio_usable and report.kvikio_reason
    assert not report.gds and report.gds_reason
    assert not report.dali_gpu and report.dali_reason
    assert report.probe_error == ""
    json.dumps(report.as_dict())  # JSON-ready for gpu_check.sh / doctor
    assert choose(report).device == "cpu"


def test_report_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CPU.cuda = True  # type: ignore[misc]


def test_probe_survives_missing_libraries(monkeypatch):
    for name in ("torch", "kvikio", "cupy", "nvidia.dali"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    report = probe()
    assert not report.cuda and "torch cannot be imported" in report.cuda_reason
    assert not report.kvikio_usable and "hsgds[cu13]" in report.kvikio_reason
    assert report.dali_version is None and report.dali_reason.startswith("not installed")
    assert report.probe_error == ""




@pytest.mark.parametrize("how", ["env", "set"])
def test_device_cpu_forces_cpu(hsgds_env, how):
    hsgds_env("HSGDS_DEVICE", None)
    if how == "env":
        hsgds_env("HSGDS_DEVICE", "cpu")
        report = probe()
    else:
        with defaults.set(device="cpu"):
            report = probe()
    assert report.forced_cpu and report.device_setting == "cpu"
    assert not report.cuda and "HSGDS_DEVICE=cpu" in report.cuda_reason
    assert not report.kvikio_usable
    choice = choose(report)
    assert (choice.device, choice.reader, choice.engine) == ("cpu", "posix", AUTO_ENGINE["cpu"])
    assert any("HSGDS_DEVICE=cpu" in r for r in choice.reasons)


def test_device_cpu_overrides_a_gpu():
    forced = dataclasses.replace(GPU, device_setting="cpu")
    choice = choose(forced)
    assert (choice.device, choice.reader) == ("cpu", "posix")
    with pytest.raises(ConfigError, match="HSGDS_DEVICE=cpu forces the CPU path"):
        choose(forced, reader="kvikio")


def test_wsl_detected_from_env(monkeypatch):
    monkeypatch.setenv("WSL_DISTRO_NAME", "Ubuntu-24.04")
    assert probe().wsl


def test_cufile_log_kept_out_of_the_working_directory(monkeypatch):
    from hsgds.io.kvikio_support import import_kvikio

    monkeypatch.delenv("CUFILE_LOGFILE_PATH", raising=False)
    monkeypatch.setitem(sys.modules, "kvikio", None)
    with pytest.raises(DependencyError):
        import_kvikio()
    path = os.environ["CUFILE_LOGFILE_PATH"]
    assert Path(path).parent == Path(__import__("tempfile").gettempdir())
    monkeypatch.setenv("CUFILE_LOGFILE_PATH", "/somewhere/cufile.log")  # a user's choice is kept
    with pytest.raises(DependencyError):
        import_kvikio()
    assert os.environ["CUFILE_LOGFILE_PATH"] == "/somewhere/cufile.log"


def test_cuda_extra():
    assert cuda_extra("13.0") == 'pip install "hsgds[cu13]"'
    assert cuda_extra("12.8") == 'pip install "hsgds[cu12]"'
    assert cuda_extra(None) == 'pip install "hsgds[cu13]"'


# ------------------------------------------------------------------------------------------ choose

def test_choose_cpu():
    choice = choose(CPU)
    assert isinstance(choice, Choice)
    assert (choice.device, choice.reader, choice.engine, choice.kind) == ("cpu", "posix", "torch", "cpu")
    assert len(choice.reasons) == 3


def test_choose_cuda_with_kvikio():
    choice = choose(GPU)
    assert (choice.device, choice.reader, choice.engine) == ("cuda:0", "kvikio", AUTO_ENGINE["cuda"])
    assert any("compat mode" in r and "nvidia-fs" in r for r in choice.reasons)


def test_choose_cuda_with_gds():
    gds = dataclasses.replace(GPU, gds=True, compat_mode="AUTO", gds_reason="GPUDirect Storage available")
    choice = choose(gds)
    assert choice.reader == "kvikio"
    assert any("GPUDirect Storage" in r and "compat" not in r for r in choice.reasons)


def test_choose_cuda_without_kvikio_native_windows():
    windows = dataclasses.replace(GPU, windows=True, kvikio_version=None, kvikio_usable=False,
                                  kvikio_reason="kvikio is Linux-only (native Windows)")
    choice = choose(windows)
    assert (choice.device, choice.reader) == ("cuda:0", "posix-pinned")
    assert any("native Windows" in r for r in choice.reasons)
    with pytest.raises(DependencyError, match=r'pip install "hsgds\[cu13\]"'):
        choose(windows, reader="kvikio")


def test_choose_wsl_reports_compat_mode():
    wsl = dataclasses.replace(GPU, wsl=True, gds_reason="GPUDirect Storage is not supported under WSL2")
    choice = choose(wsl)
    assert choice.reader == "kvikio"
    assert any("compat mode" in r and "WSL2" in r for r in choice.reasons)


def test_choose_explicit_readers_on_cuda():
    assert choose(GPU, reader="posix-pinned").reader == "posix-pinned"
    assert choose(GPU, reader="posix").reader == "posix"
    assert choose(GPU, reader="kvikio").reader == "kvikio"
    broken = dataclasses.replace(GPU, kvikio_usable=False, kvikio_reason="libcufile.so.0 not found")
    with pytest.raises(DependencyError, match=r'libcufile.*pip install "hsgds\[cu13\]"'):
        choose(broken, reader="kvikio")
    assert choose(broken).reader == "posix-pinned"


def test_choose_kvikio_on_cpu_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"reader='kvikio' needs a CUDA driver.*CPU-only.*reader='posix'"):
        choose(CPU, reader="kvikio")
    with pytest.raises(ConfigError, match="posix-pinned.*reader='posix'"):
        choose(CPU, reader="posix-pinned")


@pytest.mark.parametrize("report, extra", [(CPU, "dali"), (GPU, "cu13"),
                                           (dataclasses.replace(GPU, cuda_runtime="12.8"), "cu12")])
def test_choose_dali_without_dali_names_the_extra(report, extra):
    with pytest.raises(DependencyError, match=rf"engine='dali'.*pip install \"hsgds\[{extra}\]\""):
        choose(report, engine="dali")


def test_choose_dali_when_usable(monkeypatch):
    cpu_dali = dataclasses.replace(CPU, dali_version="2.4.0", dali_reason="CPU pipelines only")
    assert choose(cpu_dali, engine="dali").engine == "dali"
    gpu_dali = dataclasses.replace(GPU, dali_version="2.4.0", dali_gpu=True, dali_reason="")
    assert choose(gpu_dali, engine="dali").engine == "dali"
    no_gpu_backend = dataclasses.replace(GPU, dali_version="2.4.0", dali_reason="DALI cannot use CUDA")
    with pytest.raises(DependencyError, match="DALI's GPU backend"):
        choose(no_gpu_backend, engine="dali")
    # the auto table decides; an unusable DALI default falls back to torch with a reason
    monkeypatch.setitem(AUTO_ENGINE, "cuda", "dali")
    assert choose(gpu_dali).engine == "dali"
    fallback = choose(no_gpu_backend)
    assert fallback.engine == "torch" and any("DALI is not usable" in r for r in fallback.reasons)


def test_choose_device_setting_errors():
    with pytest.raises(ConfigError, match="HSGDS_DEVICE=cuda but CUDA is not usable"):
        choose(dataclasses.replace(CPU, device_setting="cuda"))
    with pytest.raises(ConfigError, match="1 CUDA device"):
        choose(dataclasses.replace(GPU, device_setting="cuda:3"))
    with pytest.raises(ConfigError, match="HSGDS_DEVICE=gpu is not a device"):
        choose(dataclasses.replace(GPU, device_setting="gpu"))
    assert choose(dataclasses.replace(GPU, device_setting="cuda")).device == "cuda:0"
    two = dataclasses.replace(GPU, device_setting="cuda:1", device_count=2)
    assert choose(two).device == "cuda:1"


def test_auto_and_bare_cuda_mean_the_current_device():
    """As in torch, "cuda" is the current CUDA device: a torch.distributed rank that called
    torch.cuda.set_device(local_rank) gets its own GPU, not every rank cuda:0."""
    two = dataclasses.replace(GPU, device_count=2)
    assert choose(two, current_device=1).device == "cuda:1"
    assert choose(two, device="cuda", current_device=1).device == "cuda:1"
    import torch

    assert choose(two, device=torch.device("cuda"), current_device=1).device == "cuda:1"
    assert choose(dataclasses.replace(two, device_setting="cuda"), current_device=1).device == "cuda:1"
    assert choose(two, device="cuda:0", current_device=1).device == "cuda:0"  # an index given wins
    assert choose(two).device == "cuda:0"
    # given as a function (torch.cuda.current_device, which initialises CUDA), it is asked only when CUDA is
    # chosen without an index: a CPU loader on a GPU machine never initialises CUDA
    asked = []

    def current() -> int:
        asked.append(1)
        return 1

    assert choose(two, device="cpu", current_device=current).device == "cpu"
    assert choose(dataclasses.replace(two, device_setting="cpu"), current_device=current).device == "cpu"
    assert choose(two, device="cuda:0", current_device=current).device == "cuda:0"
    assert choose(CPU, current_device=current).device == "cpu"
    assert not asked
    assert choose(two, current_device=current).device == "cuda:1" and asked


def test_choose_unknown_names():
    with pytest.raises(ConfigError, match="unknown reader 'gds'"):
        choose(CPU, reader="gds")
    with pytest.raises(ConfigError, match="unknown engine 'numpy'"):
        choose(CPU, engine="numpy")


def test_doctor_report():
    text = doctor_report(GPU, choose(GPU))
    assert "would use: device=cuda:0 reader=kvikio engine=torch" in text
    assert "NVIDIA H200" in text and "kvikio-compat" in text and "nvidia-fs" in text
    assert "cannot choose" in doctor_report(CPU, reader="kvikio")
    assert "device=cpu reader=posix" in doctor_report(probe())


def test_doctor_says_whether_the_fused_cpu_cut_runs(monkeypatch, hsgds_env):
    """The doctor's "CPU cut" line: numba's version and the folder where the compiled kernel is kept;
    off by the setting; numba missing: the reason, naming the pip extra."""
    numba = pytest.importorskip("numba")
    from hsgds.doctor import cpu_cut_status
    from hsgds.engines import cpu_cut

    line = cpu_cut_status()
    folder = cpu_cut.cache_folder()
    assert line.startswith(f"yes  numba {numba.__version__},") and folder and line.endswith(f"kept in {folder}")
    assert Path(folder).is_absolute()
    assert f"CPU cut       {line}" in doctor_report(CPU, cpu_cut=line)
    assert "CPU cut" not in doctor_report(CPU)
    hsgds_env("HSGDS_NUMBA", "false")
    assert cpu_cut_status().startswith("no   setting numba is off")
    hsgds_env("HSGDS_NUMBA", None)
    monkeypatch.setitem(sys.modules, "numba", None)  # "import numba" raises ImportError
    monkeypatch.delitem(sys.modules, "hsgds.engines._cpu_kernel", raising=False)
    monkeypatch.setattr(cpu_cut, "_state", {})
    line = cpu_cut_status()
    assert line.startswith("no   torch ops cut on the CPU: ") and 'pip install "hsgds[cpu]"' in line
    assert cpu_cut.cache_folder() is None


# ------------------------------------------------------------------- platforms: WSL2, native Windows

def _fake_kvikio_mode(compat: str, preferred: bool, gds: bool) -> types.SimpleNamespace:
    """A kvikio module as kvikio_mode() sees it: requested compat mode, whether it reduces to ON, GDS."""
    import enum

    mode = enum.Enum("CompatMode", "ON OFF AUTO")[compat]
    defaults_ = types.SimpleNamespace(get=lambda name: mode, is_compat_mode_preferred=lambda: preferred)
    return types.SimpleNamespace(defaults=defaults_, DriverProperties=lambda: types.SimpleNamespace(
        is_gds_available=gds))


@pytest.fixture
def old_kvikio_driver_api(monkeypatch):
    """Make `from kvikio import cufile_driver` fail so kvikio_mode() uses DriverProperties (kvikio < 24.12)."""
    monkeypatch.setitem(sys.modules, "kvikio", types.ModuleType("kvikio"))


def test_kvikio_mode_compat_on_wsl_and_linux(old_kvikio_driver_api):
    from hsgds.io.kvikio_support import kvikio_mode

    gds, mode, why = kvikio_mode(_fake_kvikio_mode("AUTO", preferred=False, gds=False), wsl=True)
    assert (gds, mode) == (False, "AUTO") and "not supported under WSL2" in why and "compat mode" in why
    gds, mode, why = kvikio_mode(_fake_kvikio_mode("ON", preferred=True, gds=True), wsl=False)
    assert (gds, mode) == (False, "ON") and "KVIKIO_COMPAT_MODE" in why
    gds, mode, why = kvikio_mode(_fake_kvikio_mode("AUTO", preferred=True, gds=False), wsl=False)
    assert not gds and "falls back to compat mode" in why
    gds, mode, why = kvikio_mode(_fake_kvikio_mode("AUTO", preferred=False, gds=True), wsl=False)
    assert gds and "GPUDirect Storage available" in why


def test_probe_parts_on_native_windows(monkeypatch):
    from hsgds.probe import _probe_dali, _probe_kvikio

    imported = []
    monkeypatch.setattr("hsgds.probe.import_kvikio", lambda *a: imported.append(a))
    info = {"windows": True, "cuda": True, "cuda_runtime": "13.0"}
    _probe_kvikio(info, windows=True, wsl=False)
    _probe_dali(info, gpu=True)
    assert imported == []  # not even tried
    assert not info["kvikio_usable"] and "Linux-only" in info["kvikio_reason"]
    assert not info["gds"] and "Linux-only" in info["gds_reason"]
    assert not info["dali_gpu"] and "no native Windows build" in info["dali_reason"]
    assert "torch engine" in info["dali_reason"]


WINDOWS = dataclasses.replace(GPU, platform="Windows AMD64", windows=True, kvikio_version=None,
                              kvikio_usable=False, kvikio_reason="kvikio is Linux-only (native Windows)",
                              gds_reason="GPUDirect Storage is Linux-only", compat_mode=None,
                              dali_reason="DALI has no native Windows build (Linux and WSL2 only)")
WSL = dataclasses.replace(GPU, platform="Linux x86_64", wsl=True,
                          gds_reason="GPUDirect Storage is not supported under WSL2; cuFile runs in its compat mode")


def test_native_windows_uses_posix_pinned_and_torch(monkeypatch):
    choice = choose(WINDOWS)
    assert (choice.device, choice.reader, choice.engine) == ("cuda:0", "posix-pinned", "torch")
    with pytest.raises(ConfigError, match="not available on native Windows.*engine='torch'.*WSL2"):
        choose(WINDOWS, engine="dali")
    monkeypatch.setitem(AUTO_ENGINE, "cuda", "dali")  # even if benchmarks made DALI the default
    fallback = choose(WINDOWS)
    assert fallback.engine == "torch" and any("no native Windows build" in r for r in fallback.reasons)
    text = doctor_report(WINDOWS)
    assert "(native Windows)" in text and "reader=posix-pinned engine=torch" in text
    assert "native Windows: kvikio and DALI are Linux-only" in text
    assert 'no `if __name__ == "__main__":` guard' in text


def test_wsl_doctor_says_compat_mode_and_where_data_goes():
    text = doctor_report(WSL)
    assert "(WSL2)" in text and "reader=kvikio" in text and "kvikio-compat" in text
    assert "WSL2: kvikio in compat mode (WSL2 has no GPUDirect Storage)" in text
    assert "not under /mnt/c" in text and "pinned host memory is limited" in text
    assert 'no `if __name__ == "__main__":` guard' in text
    # kvikio missing under WSL2: posix-pinned, with the extra that adds it
    no_kvikio = dataclasses.replace(WSL, kvikio_version=None, kvikio_usable=False,
                                    kvikio_reason="kvikio is not installed")
    choice = choose(no_kvikio)
    assert choice.reader == "posix-pinned"
    assert any('pip install "hsgds[cu13]" adds kvikio on Linux/WSL2' in r for r in choice.reasons)
    assert "WSL2: reader posix-pinned" in doctor_report(no_kvikio)
    # no usable GPU under WSL2: the CPU path, and no pinned-memory advice
    cpu_text = doctor_report(dataclasses.replace(CPU, wsl=True))
    assert "WSL2: the CPU path" in cpu_text and "pinned" not in cpu_text


MOUNTS = """\
/dev/sdc / ext4 rw,relatime 0 0
C:\\134 /mnt/c 9p rw,noatime,aname=drvfs 0 0
/dev/nvme0n1p1 /mnt/nvme xfs rw 0 0
/dev/nvme1n1 /home/me/my\\040data ext4 rw 0 0
overlay /work overlay rw 0 0
"""


def test_mount_of():
    from hsgds.doctor import mount_of

    assert mount_of("/mnt/c/Users/me/ip.zarr", MOUNTS) == ("/mnt/c", "9p")
    assert mount_of("/mnt/nvme/ip.zarr", MOUNTS) == ("/mnt/nvme", "xfs")
    assert mount_of("/mnt/nvmex/ip.zarr", MOUNTS) == ("/", "ext4")  # a prefix is not a parent
    assert mount_of("/home/me/my data/ip.zarr", MOUNTS) == ("/home/me/my data", "ext4")
    assert mount_of("/", MOUNTS) == ("/", "ext4")
    assert mount_of(Path.cwd()) is not None or not sys.platform.startswith("linux")


def test_doctor_store_warnings():
    from hsgds.doctor import platform_notes

    notes = platform_notes(WSL, choose(WSL), "/mnt/c/Users/me/ip.zarr", MOUNTS)
    assert any(n.startswith("WARNING: store /mnt/c/Users/me/ip.zarr is on a Windows drive (9p)") for n in notes)
    notes = platform_notes(WSL, choose(WSL), "/home/me/my data/ip.zarr", MOUNTS)
    assert not any("WARNING" in n for n in notes) and "store /home/me/my data/ip.zarr: on ext4" in notes[-1]
    notes = platform_notes(GPU, choose(GPU), "/work/ip.zarr", MOUNTS)
    assert any("WARNING" in n and "overlay" in n and "docker/README.md" in n for n in notes)
    assert notes[0] == "Linux: kvikio compat mode: POSIX reads + host-to-device copies"
    gds = dataclasses.replace(GPU, gds=True)
    assert platform_notes(gds, choose(gds))[0].startswith("Linux: GPUDirect Storage")
    assert platform_notes(CPU, choose(CPU)) == []  # plain Linux CPU: nothing to add


@no_cuda_here
def test_doctor_cli_require_gpu_and_store(run_cli, tmp_path):
    code, out, err = run_cli("doctor", "--store", tmp_path)
    assert code == 0 and "would use: device=cpu" in out and f"store {tmp_path}: on " in out
    code, out, err = run_cli("doctor", "--require-gpu")
    assert code == 1 and "unhealthy: no usable CUDA GPU" in err
    code, out, err = run_cli("doctor", "--require-gpu", "--reader", "kvikio")
    assert code == 1 and "cannot choose" in out and "unhealthy" in err
    # a reader that cannot run here: a loader built with it would fail, so a script checking with doctor must too
    code, out, err = run_cli("doctor", "--reader", "kvikio")
    assert code == 1 and "cannot choose" in out and err.startswith("hsgds doctor: unhealthy: ") and err.count("\n") == 1
    for args, message in ((("--reader", "banana"), "'banana' is not one of 'auto', 'posix', 'posix-pinned', 'kvikio'"),
                          (("--engine", "banana"), "'banana' is not one of 'auto', 'torch', 'dali'"),
                          (("--store", tmp_path / "missing.zarr"), "does not exist")):
        code, out, err = run_cli("doctor", *args)
        assert code == 2 and message in err and out == "", (args, err)


def test_doctor_offers_every_reader_and_engine():
    from hsgds import cli
    from hsgds.engines import ENGINES
    from hsgds.io import READERS

    options = {p.name: p.type.choices for p in cli.doctor.params if p.name in ("reader", "engine")}
    assert sorted(options["reader"]) == sorted(["auto", *READERS])
    assert sorted(options["engine"]) == sorted(["auto", *ENGINES])


@pytest.mark.gpu
@requires_cuda
def test_gpu_probe_sees_cuda_and_kvikio():
    report = probe()
    assert report.cuda and report.device_count >= 1 and report.device_name
    assert report.cuda_driver and report.cuda_runtime
    choice = choose(report)
    assert choice.device == "cuda:0"
    if report.kvikio_version is not None:
        assert report.kvikio_usable, report.kvikio_reason
        assert choice.reader == "kvikio"
        assert report.gds or "compat" in report.gds_reason
