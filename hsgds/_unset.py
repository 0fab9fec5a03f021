"""Defaults that mean "not given", and say so in ``help()`` instead of ``<object object at 0x...>``."""

from __future__ import annotations


class Unset:
    """A keyword argument's default when "not given" depends on other arguments; its repr says what then."""

    def __init__(self, meaning: str) -> None:
        self.meaning = meaning

    def __repr__(self) -> str:
        return f"<{self.meaning}>"
