"""Wording shared by messages and reports."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with its noun: "1 tile", "4 tiles", "2 classes" (``plural`` when adding "s" is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
