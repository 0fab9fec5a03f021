"""Which device, reader and engine hsgds uses on a machine: :func:`choose` turns a
:class:`~hsgds.probe.DeviceReport` and the caller's requests into a :class:`Choice` with one reason per
decision, raising :class:`~hsgds.errors.ConfigError` / :class:`~hsgds.errors.DependencyError` (naming the
pip extra) when an explicit request cannot be met.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hsgds import defaults
from hsgds._optional import cuda_extra, pip_install
from hsgds.errors import ConfigError, DependencyError, shown
from hsgds.io import READERS as _READER_REGISTRY
from hsgds.probe import DeviceReport

__all__ = ["AUTO_ENGINE", "ENGINES", "READERS", "Choice", "choose"]

#: Engine picked by ``engine="auto"`` per device kind; benchmarks decide (see benchmarks/).
AUTO_ENGINE: dict[str, str] = {"cpu": "torch", "cuda": "torch"}
READERS = tuple(_READER_REGISTRY)  # the reader registry's names: "posix", "posix-pinned", "kvikio"
ENGINES = ("torch", "dali")


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


def _device_for(report: DeviceReport, reasons: list[str], requested: str | None = None,
                current: Callable[[], int] = lambda: 0) -> str:
    setting = report.device_setting if requested is None else requested
    said = defaults.given_as("device", setting) if requested is None else f"device={shown(setting)}"
    if setting == "cpu":
        reasons.append(f"device cpu: {said} forces the CPU path")
        return "cpu"
    if setting == "auto":
        if report.cuda:
            index = current()
            reasons.append(f"device cuda:{index}: {report.device_name or 'a CUDA GPU'} is usable"
                           + (" (the current CUDA device)" if index else ""))
            return f"cuda:{index}"
        reasons.append(f"device cpu: no usable CUDA ({report.cuda_reason})")
        return "cpu"
    if setting == "cuda" or (setting.startswith("cuda:") and setting[5:].isdigit()):
        index = int(setting[5:]) if ":" in setting else (current() if report.cuda else 0)
        if not report.cuda:
            raise ConfigError(f"{said} but CUDA is not usable here ({report.cuda_reason}); "
                              f"{'unset it' if requested is None else 'leave device unset'} or use 'cpu'")
        if index >= report.device_count:
            raise ConfigError(f"{said} but this machine has {report.device_count} CUDA "
                              f"device(s); use cuda:0..cuda:{report.device_count - 1}")
        reasons.append(f"device cuda:{index}: requested by {said}")
        return f"cuda:{index}"
    raise ConfigError(f"{said} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'")


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
        extra = pip_install("dali") if kind == "cpu" else cuda_extra(report.cuda_runtime)
        what = "DALI" if kind == "cpu" else "DALI's GPU backend"
        raise DependencyError(f"engine='dali' requested but {what} is not usable ({report.dali_reason}); "
                              f"install it with {extra}, or use engine='torch'")
    reasons.append(f"engine {engine}: requested")
    return engine


def _dali_ok(report: DeviceReport, kind: str) -> bool:
    return report.dali_gpu if kind == "cuda" else report.dali_version is not None


def choose(report: DeviceReport, reader: str = "auto", engine: str = "auto", device: Any = None,
           current_device: int | Callable[[], int] = 0) -> Choice:
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
    current_device
        The CUDA device "auto" and a bare "cuda" mean, as in torch: ``torch.cuda.current_device()``, which a
        torch.distributed rank sets to its own GPU (``torch.cuda.set_device(local_rank)``); a function is called
        only when the choice needs it (CUDA chosen without an index), so that a CPU loader never initialises
        CUDA.

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
    # (an array compared with the names would raise numpy's ambiguity error, not this one)
    if not isinstance(reader, str) or reader not in ("auto", *READERS):
        raise ConfigError(f"unknown reader {shown(reader)}; use one of: auto, {', '.join(READERS)}")
    if not isinstance(engine, str) or engine not in ("auto", *ENGINES):
        raise ConfigError(f"unknown engine {shown(engine)}; use one of: auto, {', '.join(ENGINES)}")
    reasons: list[str] = []
    requested = None if device is None else str(device)
    if requested is None:
        defaults.get("device")  # an invalid HSGDS_DEVICE is an error here: the probe, which never raises, read "auto"
    current = current_device if callable(current_device) else (lambda: int(current_device))  # type: ignore[arg-type]
    if requested == "cuda" and report.cuda:
        requested = f"cuda:{current()}"
    device = _device_for(report, reasons, requested, current)
    kind = device.split(":")[0]
    picked_reader = _reader_for(report, device, reader, reasons)
    picked_engine = _engine_for(report, kind, engine, reasons)
    return Choice(device=device, reader=picked_reader, engine=picked_engine, reasons=reasons)

