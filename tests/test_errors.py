"""errors.one_line and errors.shown: the helpers that keep hsgds errors on one line, and a sweep of the public
options given arrays, tensors and odd values where scalars are expected."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

import hsgds
from hsgds.errors import HsgdsError, one_line, shown


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


def test_shown_puts_arrays_and_long_values_on_one_short_line():
    """numpy and torch wrap an array's repr over several lines: a message shows its kind, shape, dtype and
    first values instead (written out here by hand), anything else its repr with whitespace collapsed."""
    assert shown(np.arange(12).reshape(3, 4)) == "numpy array of shape (3, 4) int64 [0, 1, 2, ...]"
    assert shown(np.arange(10).reshape(2, 5).T) == "numpy array of shape (5, 2) int64 [0, 5, ...]"
    assert shown(torch.zeros(50, 50)) == "Tensor of shape (50, 50) float32 [0.0, 0.0, 0.0, ...]"
    assert shown(np.array([1.5, np.nan, np.inf])) == "numpy array of shape (3,) float64 [1.5, nan, inf]"
    assert shown(np.ones((0, 3))) == "numpy array of shape (0, 3) float64 []"
    assert shown(np.array(5)) == "array(5)" and shown("a\nb") == "'a\\nb'" and shown(7) == "7"
    assert shown({"a": np.arange(30).reshape(5, 6)}, 40) == "{'a': array([[ 0, 1, 2, 3, 4, 5], [ 6..."
    assert shown("x" * 1000) == "'" + "x" * 56 + "..."


# values a user may pass where a scalar, a name or a flag is expected
_ODD_VALUES = {
    "int 2-D array": np.arange(12).reshape(3, 4), "float32 3-D array": np.zeros((2, 2, 2), np.float32),
    "nan array": np.array([1.5, np.nan, np.inf]), "large 2-D array": np.ones((50, 50)),
    "str array": np.array(["a", "b"]), "bool array": np.array([[True, False], [False, True]]),
    "0-d array": np.array(5), "numpy scalars": [np.int64(1), np.int64(2)], "nested list": [[1, 2], [3, 4]],
    "nan": float("nan"), "inf": float("inf"), "-inf": -float("inf"), "huge int": 10**30, "-huge int": -10**30, "int past float": 10**400,
    "2**64": 2**64, "float32 nan": np.float32("nan"), "tensor": torch.arange(12).reshape(3, 4),
    "large tensor": torch.zeros(50, 50), "newline": "a\nb", "long str": "x" * 1000,
    "dict of an array": {"a": np.arange(30).reshape(5, 6)}, "tuple with an array": (np.arange(6).reshape(2, 3), 1),
}


def _messages(call, options, paths=()):
    """Each option given each odd value: the (option, value, error) of every error that is not one short
    line of hsgds's own (numpy's "truth value of an array is ambiguous" names no option). (Values it accepts
    are fine: it may take a numpy integer where it wants an integer.) Options in
    ``paths`` are not given strings: a path is printed as given, however long, a newline in it included."""
    bad = []
    for option in options:
        for name, value in _ODD_VALUES.items():
            if option in paths and isinstance(value, str):
                continue
            try:
                call(**{option: value})
            except Exception as exc:
                message = str(exc)
                if not isinstance(exc, HsgdsError) or "\n" in message or len(message) >= 400:
                    bad.append(f"{option}={name}: {type(exc).__name__}: {message[:120]!r}")
    return bad


@pytest.fixture(scope="module")
def small_store(synthetic_store):
    return synthetic_store(20, 20, 4, classes=3, seed=1, labelled_fraction=1.0, tile=26, max_patch=7)


def test_loader_and_augment_options_fail_on_one_short_line(small_store):
    store = small_store[0]

    def loader(**kw):
        with hsgds.PatchLoader(store, **{"patch_size": 3, "batch_size": 8, "device": "cpu", **kw}):
            pass

    options = [p for p in inspect.signature(hsgds.PatchLoader).parameters if p != "store"]
    assert _messages(loader, options) == []
    assert _messages(hsgds.Augment, list(inspect.signature(hsgds.Augment).parameters)) == []


def test_predict_options_fail_on_one_short_line(small_store):
    store = small_store[0]
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4 * 9, 3))

    def predict(**kw):
        hsgds.predict(store, model, **{"patch_size": 3, "batch_size": 64, "device": "cpu", **kw})

    options = [p for p in inspect.signature(hsgds.predict).parameters
               if p not in ("store", "model", "progress")]
    assert _messages(predict, options, paths={"out", "probabilities"}) == []


def test_convert_options_fail_on_one_short_line(small_store, tmp_path):
    from hsgds.preprocess.convert import ConvertOptions, convert

    src = small_store[0].parent / "cube.npy"

    def converted(**kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert(src, tmp_path / "o.zarr", ConvertOptions(**{"tile": 26, "max_patch": 7, "overwrite": True, **kw}))

    options = list(inspect.signature(ConvertOptions).parameters)
    assert _messages(converted, options, paths={"labels", "train_mask", "val_mask", "test_mask"}) == []


def test_shown_path_puts_a_path_on_one_short_line_keeping_its_file_name():
    from pathlib import Path

    from hsgds.errors import shown_path

    assert shown_path(Path("/data/run 1/map.tif")) == "/data/run 1/map.tif"  # an ordinary path as it is
    assert shown_path("a\nb\tc\x00d\x7f.tif") == "a\\nb\\tc\\x00d\\x7f.tif"  # escaped as a repr escapes them
    long = "/x/" + "d" * 5000 + "/the-map.tif"
    text = shown_path(long)
    assert len(text) <= 400 and text.startswith("/x/ddd") and text.endswith("...the-map.tif")
    name = "n" * 5000 + ".tif"  # a file name alone too long: its end is kept
    assert len(shown_path(name)) <= 400 and shown_path(name).endswith("nnn.tif")
    real = "/scratch/project_2001234/enmap/" + "ENMAP01-____L2A-DT0000001867_20220724T104526Z_008_V010302_" * 3 + ".TIF"
    assert shown_path(real) == real  # a real path, however deep, as it is


def test_cli_errors_warnings_and_failures_are_one_line_whatever_the_paths_hold(run_cli, tmp_path):
    """A message that echoes a file name holding a newline or an escape sequence (sites that print a path
    as given) is still one line on stderr, the characters escaped as a repr escapes them: the CLI escapes
    every error, warning and failure line it writes."""
    odd = tmp_path / "scene\nred\x1b[31m.xyz"  # an unknown format: the reader names the file as given
    odd.write_bytes(b"not a cube")
    code, out, err = run_cli("convert", odd, "-o", tmp_path / "o.zarr")
    assert code == 2 and err.count("\n") == 1 and "\x1b" not in err, err
    assert err.startswith("hsgds: error: ") and "scene\\nred\\x1b[31m.xyz" in err, err
    assert not (tmp_path / "o.zarr").exists()

    pytest.importorskip("distributed")
    odd = tmp_path / "scene\x1b[31m.xyz"  # (a CSV row holds no newline)
    odd.write_bytes(b"not a cube")
    (tmp_path / "scenes.csv").write_text(f"source,name\n{odd.name},odd\n")
    code, out, err = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "coll", "--workers", "1")
    failed = [line for line in err.splitlines() if line.startswith("hsgds: failed: ")]
    assert code == 1 and "\x1b" not in err, err
    assert len(failed) == 1 and failed[0].startswith("hsgds: failed: odd: ") and "scene\\x1b[31m" in failed[0], err
