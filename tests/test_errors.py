"""errors.one_line: the one helper that puts another library's message into an hsgds one-line error."""

from __future__ import annotations

from hsgds.errors import one_line


def test_one_line_collapses_whitespace_and_cuts_long_messages():
    assert one_line(ValueError("bad\n  value\tthere")) == "bad value there"
    long = one_line(OSError("x" * 1000))
    assert len(long) == 300 and long.endswith("...")
    assert one_line(OSError("y" * 1000), 200) == "y" * 197 + "..."
    assert one_line(RuntimeError("short"), 200) == "short"


def test_one_line_with_the_type_for_messages_that_say_little():
    assert one_line(KeyError("tile"), with_type=True) == "KeyError: 'tile'"
    assert one_line(StopIteration(), with_type=True) == "StopIteration"  # no text: the type alone
    assert one_line(ValueError("a\nb" + "c" * 400), 50, with_type=True) == "ValueError: a b" + "c" * 44 + "..."
