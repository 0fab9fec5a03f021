"""kvikio helpers the reader and the probe share: import kvikio (naming the pip extra when it is missing)
and ask it how reads will go (GPUDirect Storage or compat mode).

Nothing here imports kvikio at module import time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from typing import Any

from hsgds._optional import cuda_extra
from hsgds._platform import is_wsl
from hsgds.errors import DependencyError, one_line

__all__ = ["import_kvikio", "kvikio_mode"]


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
        raise DependencyError(f"kvikio is installed but cannot be imported ({one_line(exc)}); reinstall it "
                              f"with {cuda_extra(cuda_runtime)}") from None
    except (OSError, RuntimeError) as exc:
        raise DependencyError(f"kvikio is installed but cannot load its libraries ({type(exc).__name__}: "
                              f"{one_line(exc)}); reinstall it with {cuda_extra(cuda_runtime)}") from None
    return kvikio


def _gds_available(kvikio: Any) -> bool:
    """cuFile's own answer to "can this machine do GPUDirect Storage" (new and old kvikio APIs)."""
    try:
        from kvikio import cufile_driver

        return bool(cufile_driver.get("is_gds_available"))
    except ImportError:
        return bool(kvikio.DriverProperties().is_gds_available)  # kvikio < 24.12


def kvikio_mode(kvikio: Any, *, wsl: bool | None = None) -> tuple[bool, str, str]:
    """How kvikio will read: ``(gds, requested compat mode, reason)``.

    ``gds`` is True only when kvikio hands reads to cuFile (compat mode not preferred) *and* cuFile
    reports GDS available; otherwise reads are POSIX reads plus host-to-device copies, done either by
    kvikio (its compat mode) or inside cuFile (cuFile's compat mode). May raise RuntimeError from
    libcufile; :func:`hsgds.probe.probe` records it, :class:`~hsgds.io.kvikio_reader.KvikioReader` reports compat.
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
    wsl = is_wsl() if wsl is None else wsl
    if wsl:
        why = "GPUDirect Storage is not supported under WSL2"
    elif sys.platform.startswith("linux") and not os.path.isdir("/sys/module/nvidia_fs"):
        why = "the nvidia-fs kernel module is not loaded"
    else:
        why = "cuFile reports GDS unavailable (check /etc/cufile.json and `gdscheck -p`)"
    return False, mode, f"{why}; cuFile runs in its compat mode: POSIX reads + host-to-device copies"

