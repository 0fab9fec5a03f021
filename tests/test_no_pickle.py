"""No pickle anywhere: nothing hsgds ships (runtime, converter, benchmarks, fuzz harness) can be made to
run code by a file it reads. Checked on the syntax tree, so comments and strings do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("hsgds", "preprocess", "benchmarks", "fuzz")
#: modules whose loaders execute code from data
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}


def _sources():
    for folder in SHIPPED:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = lambda node: f"{path.relative_to(ROOT)}:{node.lineno}"  # noqa: E731
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{where(node)} imports {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in UNSAFE_MODULES:
            out.append(f"{where(node)} imports from {node.module}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            kwargs = {k.arg: k.value for k in node.keywords}
            if name == "torch.load":  # its weights_only unpickler builds tensors and plain data, nothing else
                flag = kwargs.get("weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    out.append(f"{where(node)} calls {name} without weights_only=True")
            if name in ("pd.read_pickle", "pandas.read_pickle"):
                out.append(f"{where(node)} calls {name}")
            if name in ("np.load", "numpy.load"):
                flag = kwargs.get("allow_pickle")
                if not (isinstance(flag, ast.Constant) and flag.value is False):
                    out.append(f"{where(node)} calls {name} without allow_pickle=False")
            flag = kwargs.get("allow_pickle")
            if isinstance(flag, ast.Constant) and flag.value is True:
                out.append(f"{where(node)} passes allow_pickle=True")
    return out


def test_no_pickle_in_shipped_code():
    files = list(_sources())
    assert len(files) > 20  # the scan really looked at the code
    problems = [p for f in files for p in _problems(f)]
    assert problems == []


@pytest.mark.parametrize("code,expected", [
    ("import pickle", "imports pickle"),
    ("from dill import loads", "imports from dill"),
    ("torch.load(f)", "calls torch.load without weights_only=True"),
    ("torch.load(f, weights_only=False)", "calls torch.load without weights_only=True"),
    ("pd.read_pickle(f)", "calls pd.read_pickle"),
    ("np.load(f)", "without allow_pickle=False"),
    ("np.load(f, allow_pickle=True)", "allow_pickle=True"),
    ("np.save(f, a, allow_pickle=True)", "allow_pickle=True"),
])
def test_the_scan_catches_each_pattern(tmp_path, monkeypatch, code, expected):
    monkeypatch.setattr("tests.test_no_pickle.ROOT", tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text(code + "\n")
    assert any(expected in p for p in _problems(bad))
    good = tmp_path / "good.py"
    good.write_text("np.load(f, mmap_mode='r', allow_pickle=False)\n# import pickle\nx = 'torch.load'\n"
                    "torch.load(f, weights_only=True)\n")
    assert _problems(good) == []
