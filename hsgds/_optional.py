"""Optional dependencies, imported when a feature needs them, with an error that names the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from hsgds.errors import DependencyError, one_line

__all__ = ["cuda_extra", "pip_install", "require"]


def pip_install(extra: str) -> str:
    """The command installing an hsgds extra, as messages suggest it: ``pip install "hsgds[geo]"``. Double quotes
    keep the brackets from the shell in bash, zsh, PowerShell and Windows cmd.exe alike (cmd.exe passes single
    quotes on as part of the argument)."""
    return f'pip install "hsgds[{extra}]"'


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`~hsgds.errors.DependencyError` naming ``pip install "hsgds[extra]"``.

    Parameters
    ----------
    module
        Importable name, e.g. ``"matplotlib"``.
    extra
        The hsgds extra that installs it, e.g. ``"preview"``.
    feature
        What needs it, for the message (e.g. ``"hsgds preview"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == top
        what = "is not installed" if missing else f"cannot be imported ({one_line(exc)})"
        raise DependencyError(f"{feature} needs {top}, which {what}; install it with {pip_install(extra)}") from None


def cuda_extra(cuda_runtime: str | None = None) -> str:
    """The pip command installing the GPU extra that matches a CUDA runtime version ("12.8" -> cu12)."""
    major = (cuda_runtime or "").split(".")[0]
    return pip_install(f"cu{major if major in ('12', '13') else '13'}")
