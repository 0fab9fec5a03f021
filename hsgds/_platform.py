"""Facts about the platform that several modules need (kept here so io/ and the probe share them)."""

from __future__ import annotations

import os

__all__ = ["is_wsl"]


def is_wsl() -> bool:
    """True under WSL2 (``WSL_DISTRO_NAME`` set, or "microsoft" in ``/proc/version``)."""
    if os.environ.get("WSL_DISTRO_NAME"):
        return True
    try:
        with open("/proc/version", encoding="utf-8", errors="replace") as f:
            return "microsoft" in f.read().lower()
    except OSError:
        return False
