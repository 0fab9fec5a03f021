"""What this machine can use (CUDA, kvikio, GDS, CuPy, DALI) and which reader/engine hsgds picks.

:func:`probe` looks at the machine and never raises: every part it could not use is recorded with the
reason as a string. :func:`choose` turns a report and the caller's requests into a :class:`Choice`,
raising :class:`~hsgds.errors.ConfigError` / :class:`~hsgds.errors.DependencyError` (naming the pip
extra) when an explicit request cannot be met. :func:`doctor_report` renders both for ``hsgds doctor``.

Nothing heavy (torch, kvikio, CuPy, DALI) is imported at module import time, and no environment or
CUDA state is read until :func:`probe` is called.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

from hsgds import defaults
from hsgds.errors import ConfigError, DependencyError

__all__ = [
    "AUTO_ENGINE",
    "ENGINES",
    "READERS",
    "Choice",
    "DeviceReport",
    "choose",
    "cuda_extra",
    "doctor_report",
    "import_kvikio",
    "kvikio_mode",
    "mount_of",
    "platform_notes",
    "probe",
]

#: Engine picked by ``engine="auto"`` per device kind; benchmarks decide (see benchmarks/).
AUTO_ENGINE: dict[str, str] = {"cpu": "torch", "cuda": "torch"}
READERS = ("posix", "posix-pinned", "kvikio")
ENGINES = ("torch", "dali")
_PROBE_NBYTES = 4096


def cuda_extra(cuda_runtime: str | None = None) -> str:
    """The pip command installing the GPU extra that matches a CUDA runtime version ("12.8" -> cu12)."""
    major = (cuda_runtime or "").split(".")[0]
    return f"pip install 'hsgds[cu{major if major in ('12', '13') else '13'}]'"


@dataclass(frozen=True)
class DeviceReport:
    """What :func:`probe` found. Every ``*_reason`` is empty when the part is usable, else says why not.

    The defaults describe a plain CPU machine, so tests can build reports by hand.
    """

    #: the ``device`` setting (``HSGDS_DEVICE``): "auto", "cpu", "cuda" or "cuda:N"
    device_setting: str = "auto"
    platform: str = ""
    python: str = ""
    wsl: bool = False
    windows: bool = False
    # CUDA as torch sees it
    torch_version: str | None = None
    cuda: bool = False
    cuda_reason: str = "not probed"
    cuda_runtime: str | None = None  # torch.version.cuda (the CUDA torch was built for)
    cuda_driver: str | None = None  # the driver's CUDA version (cuDriverGetVersion), "13.0"
    device_count: int = 0
    device_name: str | None = None
    compute_capability: str | None = None
    # kvikio / GPUDirect Storage
    kvikio_version: str | None = None
    kvikio_usable: bool = False
    kvikio_reason: str = "not probed"
    compat_mode: str | None = None  # kvikio's requested compat mode: "ON", "OFF", "AUTO"
    gds: bool = False  # reads go through cuFile with GDS (not kvikio's or cuFile's compat mode)
    gds_reason: str = "not probed"
    # other GPU libraries
    cupy_version: str | None = None
    cupy_usable: bool = False
    cupy_reason: str = "not probed"
    dali_version: str | None = None
    dali_gpu: bool = False
    dali_reason: str = "not probed"
    #: set only if the probe itself broke (a bug): what it was doing stopped there
    probe_error: str = ""

    @property
    def forced_cpu(self) -> bool:
        """True when ``HSGDS_DEVICE=cpu`` forces the CPU path."""
        return self.device_setting == "cpu"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready), including ``forced_cpu``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["forced_cpu"] = self.forced_cpu
        return out


@dataclass(frozen=True)
class Choice:
    """The device, reader and engine hsgds would use, and why."""

    device: str  # "cpu" or "cuda:N"
    reader: str  # "posix", "posix-pinned" or "kvikio"
    engine: str  # "torch" or "dali"
    reasons: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """The device kind: "cpu" or "cuda"."""
        return self.device.split(":")[0]


# ---------------------------------------------------------------------------------------------- kvikio

def _set_cufile_log() -> None:
    """Point libcufile's log at the temp dir unless the user chose a place: by default it writes
    ``cufile.log`` into the current working directory."""
    os.environ.setdefault("CUFILE_LOGFILE_PATH", os.path.join(tempfile.gettempdir(), "hsgds-cufile.log"))


def import_kvikio(cuda_runtime: str | None = None) -> Any:
    """Import kvikio (setting ``CUFILE_LOGFILE_PATH`` first), or raise DependencyError naming the extra.

    kvikio's import can fail with ImportError (not installed), OSError / RuntimeError (libkvikio or
    libcufile cannot be loaded); all become a DependencyError.
    """
    _set_cufile_log()
    try:
        with warnings.catch_warnings():
            # import-time warnings of kvikio's own dependencies are not the caller's to act on (and
            # would fail a test run with filterwarnings=error)
            warnings.simplefilter("ignore")
            import kvikio
            import kvikio.defaults  # noqa: F401 - a submodule, not always imported by the package
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "kvikio":
            raise DependencyError(f"kvikio is not installed; install it with {cuda_extra(cuda_runtime)}") from None
        raise DependencyError(f"kvikio is installed but cannot be imported ({_one_line(exc)}); reinstall it "
                              f"with {cuda_extra(cuda_runtime)}") from None
    except (OSError, RuntimeError) as exc:
        raise DependencyError(f"kvikio is installed but cannot load its libraries ({type(exc).__name__}: "
                              f"{_one_line(exc)}); reinstall it with {cuda_extra(cuda_runtime)}") from None
    return kvikio


def _gds_available(kvikio: Any) -> bool:
    """cuFile's own answer to "can this machine do GPUDirect Storage" (new and old kvikio APIs)."""
    try:
        from kvikio import cufile_driver

        return bool(cufile_driver.get("is_gds_available"))
    except ImportError:
        return bool(kvikio.DriverProperties().is_gds_available)  # kvikio < 24.12


def kvikio_mode(kvikio: Any, *, wsl: bool | None = None) -> tuple[bool, str | None, str]:
    """How kvikio will read: ``(gds, requested compat mode, reason)``.

    ``gds`` is True only when kvikio hands reads to cuFile (compat mode not preferred) *and* cuFile
    reports GDS available; otherwise reads are POSIX reads plus host-to-device copies, done either by
    kvikio (its compat mode) or inside cuFile (cuFile's compat mode). May raise RuntimeError from
    libcufile; :func:`probe` records it, :class:`~hsgds.io.kvikio_reader.KvikioReader` reports compat.
    """
    d = kvikio.defaults
    if hasattr(d, "get"):
        requested = d.get("compat_mode")
        mode = getattr(requested, "name", str(requested))
        preferred = bool(d.is_compat_mode_preferred())
    else:  # kvikio < 24.12: compat_mode() is a bool
        preferred = bool(d.compat_mode())
        mode = "ON" if preferred else "OFF"
    if mode == "ON":
        return False, mode, "kvikio compat mode is ON (KVIKIO_COMPAT_MODE): POSIX reads + copies"
    if preferred:
        return False, mode, ("kvikio falls back to compat mode (libcufile unusable here): POSIX reads + "
                             "host-to-device copies")
    if _gds_available(kvikio):
        return True, mode, "GPUDirect Storage available: cuFile reads straight into device memory"
    wsl = _is_wsl() if wsl is None else wsl
    if wsl:
        why = "GPUDirect Storage is not supported under WSL2"
    elif sys.platform.startswith("linux") and not os.path.isdir("/sys/module/nvidia_fs"):
        why = "the nvidia-fs kernel module is not loaded"
    else:
        why = "cuFile reports GDS unavailable (check /etc/cufile.json and `gdscheck -p`)"
    return False, mode, f"{why}; cuFile runs in its compat mode: POSIX reads + host-to-device copies"


# ---------------------------------------------------------------------------------------------- probe

def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(exc)}"


def _is_wsl() -> bool:
    if os.environ.get("WSL_DISTRO_NAME"):
        return True
    try:
        with open("/proc/version", encoding="utf-8", errors="replace") as f:
            return "microsoft" in f.read().lower()
    except OSError:
        return False


def _driver_version(windows: bool) -> tuple[str | None, str]:
    """The CUDA version the installed driver supports, read from libcuda without initializing CUDA."""
    import ctypes

    errors = []
    for name in (("nvcuda.dll",) if windows else ("libcuda.so.1", "libcuda.so")):
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(_one_line(exc))
            continue
        version = ctypes.c_int(0)
        rc = lib.cuDriverGetVersion(ctypes.byref(version))
        if rc == 0 and version.value > 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}", ""
        errors.append(f"cuDriverGetVersion returned {rc}")
    return None, "no CUDA driver (" + "; ".join(errors) + ")"


_cached: dict[str, DeviceReport] = {}


def probe(refresh: bool = False) -> DeviceReport:
    """Look at this machine. Never raises; heavy imports happen here, not at module import.

    ``HSGDS_DEVICE=cpu`` (setting ``device``) skips every GPU check, so a broken driver cannot get
    in the way of the CPU path. The report is cached per process and device setting (a full probe
    imports kvikio, CuPy and DALI and makes a test read: seconds on a GPU machine); ``refresh=True``
    looks again.
    """
    try:
        key = str(defaults.get("device"))
    except ConfigError:
        key = "?"
    if not refresh and key in _cached:
        return _cached[key]
    report = _cached[key] = _probe_now()
    return report


def _probe_now() -> DeviceReport:
    with warnings.catch_warnings():
        # torch/CuPy/DALI may warn about a missing or old driver; the report carries the reason instead
        warnings.simplefilter("ignore")
        info: dict[str, Any] = {}
        try:
            _probe(info)
        except Exception as exc:  # never raise: record what broke the probe itself
            info["probe_error"] = _why(exc)
        return DeviceReport(**info)


def _probe(info: dict[str, Any]) -> None:
    try:
        setting = str(defaults.get("device")).strip().lower() or "auto"
    except Exception as exc:
        setting = "auto"
        info["cuda_reason"] = f"cannot read the device setting: {_why(exc)}"
    windows = sys.platform == "win32"
    wsl = (not windows) and _is_wsl()
    info.update(device_setting=setting, platform=f"{platform.system()} {platform.machine()}".strip(),
                python=platform.python_version(), wsl=wsl, windows=windows)
    _probe_torch(info, setting, windows)
    if setting == "cpu":
        skipped = "skipped: HSGDS_DEVICE=cpu forces the CPU path"
        info.update(cuda=False, cuda_reason=skipped, kvikio_reason=skipped, gds_reason=skipped,
                    cupy_reason=skipped)
        _probe_dali(info, gpu=False)
        return
    _probe_kvikio(info, windows, wsl)
    _probe_cupy(info)
    _probe_dali(info, gpu=info["cuda"])


def _probe_torch(info: dict[str, Any], setting: str, windows: bool) -> None:
    try:
        driver, driver_reason = _driver_version(windows)
    except Exception as exc:
        driver, driver_reason = None, f"cannot query the CUDA driver: {_why(exc)}"
    info.update(cuda_driver=driver, cuda=False)
    try:
        import torch
    except Exception as exc:
        info["cuda_reason"] = f"torch cannot be imported ({_why(exc)}); install torch first"
        return
    info.update(torch_version=str(torch.__version__), cuda_runtime=torch.version.cuda)
    if setting == "cpu":
        return
    try:
        available = bool(torch.cuda.is_available())
        if available:
            major, minor = torch.cuda.get_device_capability(0)
            info.update(cuda=True, cuda_reason="", device_count=int(torch.cuda.device_count()),
                        device_name=torch.cuda.get_device_name(0), compute_capability=f"{major}.{minor}")
            return
    except Exception as exc:
        info["cuda_reason"] = f"torch cannot use CUDA: {_why(exc)}"
        return
    if torch.version.cuda is None:
        info["cuda_reason"] = (f"torch {torch.__version__} is a CPU-only build; install a CUDA build "
                               "(https://pytorch.org/get-started/locally/)")
    elif driver is None:
        info["cuda_reason"] = driver_reason
    else:
        info["cuda_reason"] = (f"torch (CUDA {torch.version.cuda}) sees no usable GPU with driver CUDA "
                               f"{driver} (driver too old, no device, or CUDA_VISIBLE_DEVICES hides it)")


def _probe_kvikio(info: dict[str, Any], windows: bool, wsl: bool) -> None:
    extra = cuda_extra(info.get("cuda_runtime"))
    info.update(kvikio_usable=False, gds=False)
    if windows:
        info["kvikio_reason"] = "kvikio is Linux-only (native Windows); use WSL2 for kvikio"
        info["gds_reason"] = "GPUDirect Storage is Linux-only"
        return
    try:
        kvikio = import_kvikio(info.get("cuda_runtime"))
    except Exception as exc:
        info["kvikio_reason"] = _one_line(exc)
        info["gds_reason"] = "kvikio not usable"
        return
    info["kvikio_version"] = str(getattr(kvikio, "__version__", "?"))
    if info.get("cuda_driver") is None:
        # kvikio initializes CUDA for every read, even into host memory: without a driver it cannot read
        info["kvikio_reason"] = ("kvikio cannot do any I/O without a CUDA driver, not even into host "
                                 "memory; this machine uses the POSIX reader")
        info["gds_reason"] = "no CUDA driver"
        return
    try:
        info["kvikio_usable"], info["kvikio_reason"] = _kvikio_roundtrip(kvikio, info["cuda"])
    except Exception as exc:
        info["kvikio_reason"] = f"kvikio failed a {_PROBE_NBYTES}-byte test read: {_why(exc)}; try {extra}"
    if not info["kvikio_usable"]:
        info["gds_reason"] = "kvikio not usable"
        return
    try:
        info["gds"], info["compat_mode"], info["gds_reason"] = kvikio_mode(kvikio, wsl=wsl)
    except Exception as exc:
        info["gds_reason"] = f"cannot ask cuFile about GDS ({_why(exc)}); reads use compat mode"


def _kvikio_roundtrip(kvikio: Any, cuda: bool) -> tuple[bool, str]:
    """Read a small temp file with kvikio (into device memory when torch has CUDA) and compare."""
    payload = os.urandom(_PROBE_NBYTES)
    with tempfile.TemporaryDirectory(prefix="hsgds-probe-") as tmp:
        path = os.path.join(tmp, "probe.bin")
        with open(path, "wb") as f:
            f.write(payload)
        f = kvikio.CuFile(path, "r")
        try:
            if cuda:
                import torch

                buf = torch.empty(_PROBE_NBYTES, dtype=torch.uint8, device="cuda")
                got = f.pread(buf, _PROBE_NBYTES).get()
                data = bytes(buf.cpu().numpy().tobytes())
            else:
                import numpy as np

                arr = np.empty(_PROBE_NBYTES, dtype=np.uint8)
                got = f.pread(arr, _PROBE_NBYTES).get()
                data = arr.tobytes()
        finally:
            f.close()
    if got != _PROBE_NBYTES or data != payload:
        return False, f"kvikio test read returned {got} bytes / wrong data"
    return True, ""


def _probe_cupy(info: dict[str, Any]) -> None:
    info["cupy_usable"] = False
    try:
        import cupy
    except Exception as exc:
        info["cupy_reason"] = f"not installed ({_one_line(exc)})" if isinstance(exc, ImportError) else _why(exc)
        return
    info["cupy_version"] = str(getattr(cupy, "__version__", "?"))
    try:
        # without a driver this raises CUDARuntimeError (cudaErrorInsufficientDriver)
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        info["cupy_reason"] = f"CuPy cannot use CUDA: {_why(exc)}"
        return
    info["cupy_usable"] = n > 0
    info["cupy_reason"] = "" if n > 0 else "CuPy sees no CUDA device"


def _probe_dali(info: dict[str, Any], *, gpu: bool) -> None:
    info["dali_gpu"] = False
    if info.get("windows"):
        info["dali_reason"] = _DALI_WINDOWS
        return
    try:
        import nvidia.dali as dali
    except Exception as exc:
        info["dali_reason"] = f"not installed ({_one_line(exc)})" if isinstance(exc, ImportError) else _why(exc)
        return
    info["dali_version"] = str(getattr(dali, "__version__", "?"))
    if not gpu:
        info["dali_reason"] = ("CPU pipelines only: HSGDS_DEVICE=cpu" if info.get("device_setting") == "cpu"
                               else "CPU pipelines only: no usable CUDA")
        return
    try:
        from nvidia.dali import backend

        n = int(backend.GetCUDADeviceCount())
        built = int(backend.GetCudaVersion())
    except Exception as exc:
        info["dali_reason"] = f"DALI cannot use CUDA: {_why(exc)}"
        return
    info["dali_gpu"] = n > 0
    info["dali_reason"] = "" if n > 0 else f"DALI (CUDA {built // 1000}.{built % 1000 // 10}) sees no device"


# ---------------------------------------------------------------------------------------------- choose

def _device_for(report: DeviceReport, reasons: list[str], requested: str | None = None) -> str:
    setting = report.device_setting if requested is None else requested
    origin = "HSGDS_DEVICE" if requested is None else "device"
    if setting == "cpu":
        reasons.append(f"device cpu: {origin}=cpu forces the CPU path")
        return "cpu"
    if setting == "auto":
        if report.cuda:
            reasons.append(f"device cuda:0: {report.device_name or 'a CUDA GPU'} is usable")
            return "cuda:0"
        reasons.append(f"device cpu: no usable CUDA ({report.cuda_reason})")
        return "cpu"
    if setting == "cuda" or (setting.startswith("cuda:") and setting[5:].isdigit()):
        index = int(setting[5:]) if ":" in setting else 0
        if not report.cuda:
            raise ConfigError(f"{origin}={setting} but CUDA is not usable here ({report.cuda_reason}); "
                              f"unset {origin} or set it to 'cpu'")
        if index >= report.device_count:
            raise ConfigError(f"{origin}={setting} but this machine has {report.device_count} CUDA "
                              f"device(s); use cuda:0..cuda:{report.device_count - 1}")
        reasons.append(f"device cuda:{index}: requested by {origin}={setting}")
        return f"cuda:{index}"
    raise ConfigError(f"{origin}={setting!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'")


def _compat_note(report: DeviceReport) -> str:
    if report.gds:
        return "GPUDirect Storage: reads go straight from storage into device memory"
    if report.wsl:
        why = "WSL2 has no GPUDirect Storage"
    elif report.gds_reason and report.gds_reason != "not probed":
        why = report.gds_reason
    else:
        why = "GPUDirect Storage is not available"
    return f"kvikio runs in compat mode ({why}): POSIX reads + host-to-device copies in kvikio's thread pool"


def _reader_for(report: DeviceReport, device: str, reader: str, reasons: list[str]) -> str:
    extra = cuda_extra(report.cuda_runtime)
    if device == "cpu":
        if reader == "kvikio":
            why = ("HSGDS_DEVICE=cpu forces the CPU path" if report.forced_cpu else
                   f"no usable CUDA here: {report.cuda_reason}")
            raise ConfigError(f"reader='kvikio' needs a CUDA driver and GPU (kvikio cannot do any I/O "
                              f"without one, not even into host memory), but {why}; use reader='posix'")
        if reader == "posix-pinned":
            raise ConfigError("reader='posix-pinned' stages reads in pinned memory for a CUDA device, but "
                              "the device is the CPU; use reader='posix'")
        reasons.append("reader posix: os.preadv into host memory (the CPU path)"
                       if reader == "auto" else "reader posix: requested")
        return "posix"
    if reader == "kvikio":
        if not report.kvikio_usable:
            raise DependencyError(f"reader='kvikio' requested but kvikio is not usable "
                                  f"({report.kvikio_reason}); install it with {extra}, or use "
                                  "reader='posix-pinned'")
        reasons.append(f"reader kvikio: requested; {_compat_note(report)}")
        return "kvikio"
    if reader in ("posix", "posix-pinned"):
        reasons.append(f"reader {reader}: requested (POSIX reads, pinned host buffer, copy to the GPU)")
        return reader
    if report.kvikio_usable:
        reasons.append(f"reader kvikio: kvikio {report.kvikio_version or ''} is usable; {_compat_note(report)}")
        return "kvikio"
    where = " on native Windows" if report.windows else ""
    reasons.append(f"reader posix-pinned: kvikio is not usable{where} ({report.kvikio_reason}); POSIX "
                   f"reads into pinned host memory + copies to the GPU ({extra} adds kvikio on Linux/WSL2)")
    return "posix-pinned"


_DALI_WINDOWS = "DALI has no native Windows build (Linux and WSL2 only); the torch engine is used"


def _engine_for(report: DeviceReport, kind: str, engine: str, reasons: list[str]) -> str:
    if engine == "auto":
        picked = AUTO_ENGINE.get(kind, "torch")
        if picked == "dali" and not _dali_ok(report, kind):
            reasons.append(f"engine torch: the benchmark default for {kind} is dali, but DALI is not usable "
                           f"({report.dali_reason})")
            return "torch"
        reasons.append(f"engine {picked}: the benchmark default for {kind}")
        return picked
    if engine == "dali" and report.windows:
        raise ConfigError("engine='dali' is not available on native Windows (DALI ships Linux wheels only); "
                          "use engine='torch', or run under WSL2")
    if engine == "dali" and not _dali_ok(report, kind):
        extra = "pip install 'hsgds[cpu]'" if kind == "cpu" else cuda_extra(report.cuda_runtime)
        what = "DALI" if kind == "cpu" else "DALI's GPU backend"
        raise DependencyError(f"engine='dali' requested but {what} is not usable ({report.dali_reason}); "
                              f"install it with {extra}, or use engine='torch'")
    reasons.append(f"engine {engine}: requested")
    return engine


def _dali_ok(report: DeviceReport, kind: str) -> bool:
    return report.dali_gpu if kind == "cuda" else report.dali_version is not None


def choose(report: DeviceReport, reader: str = "auto", engine: str = "auto", device: Any = None) -> Choice:
    """Pick the device, reader and engine for ``report``.

    Parameters
    ----------
    report
        From :func:`probe` (or built by hand in tests).
    reader
        "auto", "posix", "posix-pinned" or "kvikio". Auto: posix on the CPU, kvikio on CUDA when it is
        usable, else posix-pinned (native Windows, or kvikio not installed).
    engine
        "auto", "torch" or "dali". Auto: :data:`AUTO_ENGINE` for the device kind (falls back to torch
        when the default is DALI and DALI is not usable).
    device
        None (the ``HSGDS_DEVICE`` setting, "auto" by default), or an explicit "cpu", "cuda", "cuda:N"
        or torch.device, which wins over the setting.

    Returns
    -------
    Choice
        With one reason per decision.

    Raises
    ------
    ConfigError
        Unknown reader/engine/device setting, or a request that cannot work here (kvikio on the CPU).
    DependencyError
        An explicitly requested library is missing or unusable; the message names the pip extra.
    """
    if reader not in ("auto", *READERS):
        raise ConfigError(f"unknown reader {reader!r}; use one of: auto, {', '.join(READERS)}")
    if engine not in ("auto", *ENGINES):
        raise ConfigError(f"unknown engine {engine!r}; use one of: auto, {', '.join(ENGINES)}")
    reasons: list[str] = []
    requested = None if device is None else str(device)
    if requested == "cuda" and report.cuda:
        requested = "cuda:0"
    device = _device_for(report, reasons, requested)
    kind = device.split(":")[0]
    picked_reader = _reader_for(report, device, reader, reasons)
    picked_engine = _engine_for(report, kind, engine, reasons)
    return Choice(device=device, reader=picked_reader, engine=picked_engine, reasons=reasons)


# ---------------------------------------------------------------------------------------------- doctor

#: Filesystems through which WSL2 reaches Windows drives (/mnt/c ...): every read crosses the VM boundary.
WINDOWS_DRIVE_FS = ("9p", "v9fs", "drvfs")
NO_MAIN_GUARD = ('no worker processes (threads only): training scripts need no `if __name__ == "__main__":` '
                 "guard, on Windows or anywhere else")


def mount_of(path: str | os.PathLike, mounts: str | None = None) -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding ``path``, from ``/proc/mounts`` (or the given
    text in its format); None where that is not available (not Linux)."""
    if mounts is None:
        try:
            with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
                mounts = f.read()
        except OSError:
            return None
    target = os.path.abspath(os.fspath(path))
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, parts[2])
    return best


def platform_notes(report: DeviceReport, choice: Choice | None, store: str | os.PathLike | None = None,
                   mounts: str | None = None) -> list[str]:
    """What the chosen path means on this platform (WSL2, native Windows, Linux), and where ``store`` is."""
    notes: list[str] = []
    reader = choice.reader if choice is not None else None
    on_gpu = choice is not None and choice.kind == "cuda"
    if report.windows:
        notes.append("native Windows: kvikio and DALI are Linux-only, so hsgds reads with POSIX reads into "
                     "pinned host memory + copies to the GPU (posix-pinned) and cuts patches with the torch "
                     "engine; run under WSL2 to use kvikio")
    elif report.wsl:
        if reader == "kvikio":
            notes.append("WSL2: kvikio in compat mode (WSL2 has no GPUDirect Storage): POSIX reads + "
                         "host-to-device copies through kvikio's pinned bounce buffers")
        elif on_gpu:
            notes.append(f"WSL2: reader {reader}: POSIX reads into pinned host memory + copies to the GPU "
                         "(WSL2 has no GPUDirect Storage)")
        else:
            notes.append("WSL2: the CPU path (POSIX reads, torch engine on the CPU)")
        notes.append("WSL2: keep stores on the WSL ext4 disk (e.g. ~/data), not under /mnt/c: Windows drives "
                     "are reached over 9P, many times slower")
        if on_gpu:
            notes.append("WSL2: pinned host memory is limited (it comes out of the WSL VM's memory, half of the "
                         "host's RAM by default; .wslconfig memory=); keep kvikio_threads modest")
    elif on_gpu and reader == "kvikio":
        notes.append("Linux: " + ("GPUDirect Storage: cuFile DMA from NVMe into device memory" if report.gds
                                  else "kvikio compat mode: POSIX reads + host-to-device copies"))
    if report.windows or report.wsl:
        notes.append(NO_MAIN_GUARD)
    if store is not None:
        where = mount_of(store, mounts)
        if where is None:
            notes.append(f"store {store}: filesystem unknown")
        else:
            point, fstype = where
            notes.append(f"store {store}: on {fstype} (mounted at {point})")
            if report.wsl and (fstype in WINDOWS_DRIVE_FS or
                               os.path.abspath(os.fspath(store)).startswith("/mnt/")
                               and fstype not in ("ext4", "xfs", "btrfs")):
                notes.append(f"WARNING: store {store} is on a Windows drive ({fstype}); copy it to the WSL "
                             "ext4 disk (e.g. ~/data) for full speed")
            elif fstype in ("overlay", "tmpfs"):
                notes.append(f"WARNING: store {store} is on {fstype}; in a container, mount the NVMe data "
                             "volume and keep stores there (docker/README.md)")
            elif report.gds and fstype not in ("ext4", "xfs"):
                notes.append(f"note: GPUDirect Storage reads local NVMe through ext4 or xfs; on {fstype} "
                             "cuFile may fall back to its compat mode")
    return notes

def _status(ok: bool, detail: str, reason: str) -> str:
    return f"yes  {detail}".rstrip() if ok else f"no   {detail + ': ' if detail else ''}{reason}"


def doctor_report(report: DeviceReport, choice: Choice | None = None, *, reader: str = "auto",
                  engine: str = "auto", store: str | os.PathLike | None = None) -> str:
    """A human-readable report of what this machine can use and what hsgds would pick, with reasons,
    and what that path means on this platform (:func:`platform_notes`; ``store``: where it lives).

    ``choice`` defaults to ``choose(report, reader, engine)``; if that raises, the error is shown.
    """
    from hsgds.errors import HsgdsError

    os_line = report.platform or "?"
    if report.wsl:
        os_line += " (WSL2)"
    elif report.windows:
        os_line += " (native Windows)"
    torch_line = (f"{report.torch_version} (built for CUDA {report.cuda_runtime or 'none: CPU-only'})"
                  if report.torch_version else "not importable")
    gpu = ""
    if report.cuda:
        gpu = (f"{report.device_name} x{report.device_count}, compute {report.compute_capability}, "
               f"driver CUDA {report.cuda_driver or '?'}")
    gds_detail = f"compat_mode={report.compat_mode}" if report.compat_mode else ""
    lines = [
        "hsgds doctor",
        f"  system        {os_line}, Python {report.python or '?'}",
        f"  HSGDS_DEVICE  {report.device_setting}{' (forces the CPU path)' if report.forced_cpu else ''}",
        f"  torch         {torch_line}",
        f"  CUDA          {_status(report.cuda, gpu, report.cuda_reason)}",
        f"  kvikio        {_status(report.kvikio_usable, report.kvikio_version or '', report.kvikio_reason)}",
        f"  GDS           {_status(report.gds, gds_detail, report.gds_reason)}",
        f"  CuPy          {_status(report.cupy_usable, report.cupy_version or '', report.cupy_reason)}",
        f"  DALI (GPU)    {_status(report.dali_gpu, report.dali_version or '', report.dali_reason)}",
    ]
    if report.probe_error:
        lines.append(f"  probe error   {report.probe_error}")
    if choice is None:
        try:
            choice = choose(report, reader, engine)
        except HsgdsError as exc:
            lines += ["", f"  cannot choose: {exc}"]
            notes = platform_notes(report, None, store)
            return "\n".join(lines + (["", "path:"] + [f"  - {n}" for n in notes] if notes else [])) + "\n"
    lines += ["", f"would use: device={choice.device} reader={choice.reader} engine={choice.engine}"]
    lines += [f"  - {r}" for r in choice.reasons]
    if choice.reader == "kvikio":
        lines.append(f"  - reader stats will show {'kvikio-gds' if report.gds else 'kvikio-compat'}")
    notes = platform_notes(report, choice, store)
    if notes:
        lines += ["", "path:"] + [f"  - {n}" for n in notes]
    return "\n".join(lines) + "\n"
