"""Patch engines: resident tiles + sample coordinates -> a normalized patch batch on the tiles' device.

``torch`` (:class:`TorchEngine`) gathers with one ``index_select`` per batch; ``dali``
(:class:`DaliEngine`) runs a DALI pipeline and needs NVIDIA DALI (imported only when such an engine is
made). Both compute the same numbers; :func:`make_engine` builds one by name.
"""

from __future__ import annotations

from typing import Any

from hsgds.engines.base import LAYOUTS, PatchEngine, PatchSpec
from hsgds.engines.dali_engine import DaliEngine
from hsgds.engines.torch_engine import TorchEngine
from hsgds.errors import ConfigError

__all__ = ["DaliEngine", "ENGINES", "LAYOUTS", "PatchEngine", "PatchSpec", "TorchEngine", "make_engine"]

ENGINES: dict[str, type[PatchEngine]] = {"dali": DaliEngine, "torch": TorchEngine}


def make_engine(name: str, spec: PatchSpec, device: Any = None, **options: Any) -> PatchEngine:
    """Build the patch engine called ``name`` ("torch" or "dali") for ``spec`` on ``device``.

    Parameters
    ----------
    name : str
        "torch" or "dali" (case-insensitive).
    spec : PatchSpec
        What every batch looks like.
    device : torch.device, str or None
        Where the ring storage lives; None means the CPU.
    **options
        Passed to the engine, e.g. ``max_batch_size`` for "dali", ``check_bounds`` for "torch".

    Raises
    ------
    ConfigError
        Unknown engine name, or an invalid spec.
    DependencyError
        The engine's library (PyTorch, DALI) is not installed; the message names the pip extra.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in ENGINES:
        raise ConfigError(f"unknown patch engine {name!r}; choose one of: {', '.join(sorted(ENGINES))}")
    return ENGINES[key](spec, device, **options)
