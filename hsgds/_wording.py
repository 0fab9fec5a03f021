"""Wording shared by messages and reports."""

from __future__ import annotations

from collections.abc import Iterable


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with its noun: "1 tile", "4 tiles", "2 classes" (``plural`` when adding "s" is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def duration(seconds: float) -> str:
    """A time span as a log line reads it, to the second under an hour, to the minute above: "42s", "5m07s",
    "1h13m", "26h40m" (at least "1s": "about 0s left" would say nothing is left)."""
    total = max(1, round(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def listed(items: Iterable[object], limit: int = 5) -> str:
    """The first ``limit`` items, comma separated, and how many more: "'a', 'b' and 3 more" (items as
    given: pass reprs or formatted strings for quoting)."""
    shown = [str(i) for i in items]
    more = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending integers as runs of consecutive ones: [0, 1, 2, 5] -> [(0, 2), (5, 5)]."""
    found: list[list[int]] = []
    for v in values:
        if found and v == found[-1][1] + 1:
            found[-1][1] = v
        else:
            found.append([v, v])
    return [(lo, hi) for lo, hi in found]


def clipped(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters (marked " ..."), so that a
    quoted message never ends mid-word."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."


def drop(named: str) -> str:
    """How to take back a setting that a message has just named: "drop --key" for an option, "leave this
    scene's cell empty" for a manifest column (``named`` as "the key column of manifest m.csv line 3")."""
    return f"drop {named}" if named.startswith("--") else "leave this scene's cell empty"


def set_to(named: str, value: str) -> str:
    """How to give a setting ``value``: "pass --band-axis first" for an option, "set the band_axis column of
    manifest m.csv line 3 to first" for a manifest column."""
    return f"pass {named} {value}" if named.startswith("--") else f"set {named} to {value}"
