"""What this machine can use (CUDA, kvikio, GDS, DALI).

:func:`probe` looks at the machine and never raises: every part it could not use is recorded in a
:class:`DeviceReport` with the reason as a string. :mod:`hsgds.choice` turns a report into a choice of
device, reader and engine; :mod:`hsgds.doctor` renders both for ``hsgds doctor``.

Nothing heavy (torch, kvikio, DALI) is imported at module import time, and no environment or
CUDA state is read until :func:`probe` is called.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import tempfile
import warnings
from dataclasses import dataclass, fields
from typing import Any

from hsgds import defaults
from hsgds._optional import cuda_extra
from hsgds._platform import is_wsl
from hsgds.errors import ConfigError, one_line
from hsgds.io.kvikio_support import import_kvikio, kvikio_mode

__all__ = ["DeviceReport", "probe"]

_PROBE_NBYTES = 4096
_DALI_WINDOWS = "DALI has no native Windows build (Linux and WSL2 only); the torch engine is used"


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



def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"


def _driver_version(windows: bool) -> tuple[str | None, str]:
    """The CUDA version the installed driver supports, read from libcuda without initializing CUDA."""
    import ctypes

    errors = []
    for name in (("nvcuda.dll",) if windows else ("libcuda.so.1", "libcuda.so")):
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(one_line(exc))
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
    imports kvikio and DALI and makes a test read: seconds on a GPU machine); ``refresh=True``
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
        # torch/DALI may warn about a missing or old driver; the report carries the reason instead
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
    wsl = (not windows) and is_wsl()
    info.update(device_setting=setting, platform=f"{platform.system()} {platform.machine()}".strip(),
                python=platform.python_version(), wsl=wsl, windows=windows)
    _probe_torch(info, setting, windows)
    if setting == "cpu":
        skipped = "skipped: HSGDS_DEVICE=cpu forces the CPU path"
        info.update(cuda=False, cuda_reason=skipped, kvikio_reason=skipped, gds_reason=skipped)
        _probe_dali(info, gpu=False)
        return
    _probe_kvikio(info, windows, wsl)
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
        info["kvikio_reason"] = one_line(exc)
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


def _dali_dist_version() -> str:
    """The installed DALI wheel's version (its distribution is named for its CUDA: nvidia-dali-cuda130, ...)."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-dali"):
            return str(dist.version)
    return "?"


def _probe_dali(info: dict[str, Any], *, gpu: bool) -> None:
    info["dali_gpu"] = False
    if info.get("windows"):
        info["dali_reason"] = _DALI_WINDOWS
        return
    if not gpu:
        # CPU pipelines need no device check: find DALI without importing it (~70 MiB and ~0.7 s of
        # imports that the default CPU engine, torch, never uses); engine="dali" imports it when built
        try:
            found = importlib.util.find_spec("nvidia.dali") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            info["dali_reason"] = "not installed (no module named 'nvidia.dali')"
            return
        info["dali_version"] = _dali_dist_version()
        info["dali_reason"] = ("CPU pipelines only: HSGDS_DEVICE=cpu" if info.get("device_setting") == "cpu"
                               else "CPU pipelines only: no usable CUDA")
        return
    try:
        import nvidia.dali as dali
    except Exception as exc:
        info["dali_reason"] = f"not installed ({one_line(exc)})" if isinstance(exc, ImportError) else _why(exc)
        return
    info["dali_version"] = str(getattr(dali, "__version__", "?"))
    try:
        from nvidia.dali import backend

        # DALI's backend.pyi stub leaves these out
        n = int(backend.GetCUDADeviceCount())  # type: ignore[attr-defined]
        built = int(backend.GetCudaVersion())  # type: ignore[attr-defined]
    except Exception as exc:
        info["dali_reason"] = f"DALI cannot use CUDA: {_why(exc)}"
        return
    info["dali_gpu"] = n > 0
    info["dali_reason"] = "" if n > 0 else f"DALI (CUDA {built // 1000}.{built % 1000 // 10}) sees no device"

