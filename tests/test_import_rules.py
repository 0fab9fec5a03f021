"""Imports go one way (format -> io -> ring -> engines -> loader -> train, predict, bench, cli).

The import statements of every module of ``hsgds`` and of the converter (``preprocess/``, imported as
``hsgds.preprocess``) are read with :mod:`ast`, module-level and inside functions alike, and checked
against :data:`LAYERS`: a module may import its own layer and the layers below it, never one above, and
the import graph has no cycle. Imports under ``if TYPE_CHECKING:`` never run, so they are left out of the
cycle check (they may name their own layer) but must still respect the layer order.

A new module must be placed in :data:`LAYERS`; the test says so when one is missing.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: import name -> folder: the runtime package and the converter (installed as ``hsgds.preprocess``)
PACKAGES = {"hsgds": ROOT / "hsgds", "hsgds.preprocess": ROOT / "preprocess"}

#: Bottom first. ``name.*`` matches every module inside the package ``name`` (and ``name`` itself).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # no hsgds imports beyond this layer: errors, settings, optional-dependency and platform helpers
    ("base", ("hsgds.errors", "hsgds._version", "hsgds.defaults", "hsgds._optional", "hsgds._platform",
              "hsgds._unset", "hsgds._wording", "hsgds._lru", "hsgds._gc", "hsgds._numba_cache",
              "hsgds._durable", "hsgds._sha256")),
    # the store format: names, metadata checks, tile offsets and checksums
    ("format", ("hsgds.format", "hsgds.checksum")),
    # the offline converter: may use the store format and the base, nothing of the runtime
    ("converter", ("hsgds.preprocess.*",)),
    # pure index arithmetic of an epoch (which samples, in which order) and the per-sample augmentation
    # parameters (counter-based, a pure function of seed, epoch and sample); no I/O
    ("sampling", ("hsgds.sampling", "hsgds.augment", "hsgds._philox_kernel")),
    # tile readers (POSIX, kvikio) and the kvikio helpers they need; no device probing
    ("io", ("hsgds.io.*",)),
    # an opened store: metadata, labels, samples, statistics (and its xarray view); collections of stores
    # which pixels of a scene a loader yields (labelled samples, or every s-th pixel)
    ("scene", ("hsgds.scene", "hsgds._xarray", "hsgds.collection", "hsgds.pixels")),
    # the converter run over a manifest on Dask: converts each scene, checks the stores it finds with
    # hsgds.scene, writes collection.json (hsgds.collection); used only by the CLI
    ("convert-many", ("hsgds.preprocess.convert_many",)),
    ("ring", ("hsgds.ring",)),
    ("engines", ("hsgds.engines.*",)),
    # what this machine can use, and which device / reader / engine to pick
    ("device", ("hsgds.probe", "hsgds.choice")),
    # the loader, and the scenes it reads as one (global tile ids, per-scene engine tables)
    ("loader", ("hsgds.loader", "hsgds.scene_set", "hsgds.batches", "hsgds.rank_settings")),
    # users of the loader and of the layers below, that the commands build on
    ("tools", ("hsgds.models", "hsgds.datasets", "hsgds.synthetic", "hsgds.info", "hsgds.preview",
               "hsgds.doctor", "hsgds.writers")),
    # the top: training, inference, benchmarks, the CLI and the package's public namespace
    ("apps", ("hsgds.train", "hsgds.inference", "hsgds.bench", "hsgds.cli", "hsgds")),
]
#: The only modules outside the converter that may import it (its convert verbs: `hsgds convert`, `hsgds demo`,
#: `hsgds convert-many`, whose orchestration runs the single-scene converter per scene).
CONVERTER_USERS = ("hsgds.cli", "hsgds.preprocess.convert_many")
CONVERTER = "converter"


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`


def find_modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module (dotted name -> file) of the given packages; a folder's ``__init__.py`` is the package.
    A sub-folder that is itself one of ``packages`` is named by that entry, not by its parent's name."""
    roots = {path.resolve(): name for name, path in packages.items()}
    found: dict[str, Path] = {}
    for name, folder in packages.items():
        for file in sorted(folder.rglob("*.py")):
            parts = file.relative_to(folder).with_suffix("").parts
            if any(p == "__pycache__" for p in parts):
                continue
            # a file under another listed package belongs to that one
            owner = next((roots[p] for p in file.resolve().parents if p in roots), name)
            if owner != name:
                continue
            dotted = ".".join((name, *parts))
            found[dotted.removesuffix(".__init__")] = file
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _typing_only_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                for sub in ast.walk(child):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def import_edges(name: str, file: Path, modules: dict[str, Path]) -> tuple[list[Edge], list[str]]:
    """The project modules ``name`` imports (every import statement, at any depth), and the problems found:
    imports of ``hsgds`` names that are no module of the project."""
    tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    typing_only = _typing_only_lines(tree)
    is_package = file.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    edges: list[Edge] = []
    problems: list[str] = []

    def add(target: str, node: ast.stmt) -> None:
        edges.append(Edge(name, target, node.lineno, node.lineno in typing_only))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "hsgds":
                    continue
                if alias.name in modules:
                    add(alias.name, node)
                else:
                    problems.append(f"{name}:{node.lineno}: `import {alias.name}`: no such module in the project")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "hsgds":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:  # `from hsgds import defaults`: the submodule
                    add(sub, node)
                elif source in modules:  # `from hsgds.errors import ConfigError`: the module itself
                    add(source, node)
                else:
                    problems.append(f"{name}:{node.lineno}: `from {source} import {alias.name}`: no such module "
                                    "in the project")
    return edges, problems


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    """Index of the layer holding ``module`` (an exact name wins over a ``pkg.*`` pattern), or None."""
    for i, (_, patterns) in enumerate(layers):
        if module in patterns:
            return i
    for i, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            if pattern.endswith(".*") and (module == pattern[:-2] or fnmatchcase(module, pattern)):
                return i
    return None


def find_cycles(edges: list[Edge]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a module importing
    itself) among the edges that run, each as a closed path."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.typing_only:
            graph.setdefault(e.importer, set()).add(e.imported)
            graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the package graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        # one closed path through the component, for the message
        members, path = set(component), [component[0]]
        while True:
            nxt = next(w for w in sorted(graph[path[-1]]) if w in members)
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
                break
            path.append(nxt)
    return cycles


def check(packages: dict[str, Path], layers: list[tuple[str, tuple[str, ...]]],
          converter_users: tuple[str, ...] = CONVERTER_USERS) -> list[str]:
    """Every violation of the import rules in ``packages``, one line each (empty: all is well)."""
    modules = find_modules(packages)
    names = [n for n, _ in layers]
    problems: list[str] = []
    edges: list[Edge] = []
    for name, file in sorted(modules.items()):
        found, bad = import_edges(name, file, modules)
        edges += found
        problems += bad
        if layer_of(name, layers) is None:
            shown = next(file.relative_to(f.parent) for f in packages.values() if file.is_relative_to(f))
            problems.append(f"{name} ({shown.as_posix()}) is in no layer: add it to LAYERS in "
                            f"{Path(__file__).name}, at the level of what it imports")
    for e in edges:
        low, high = layer_of(e.importer, layers), layer_of(e.imported, layers)
        if low is None or high is None:
            continue
        if high > low:
            problems.append(f"{e.importer}:{e.line} imports {e.imported}: upward, from layer {names[low]!r} into "
                            f"{names[high]!r}")
        if (CONVERTER in names and high == names.index(CONVERTER) and low != high
                and e.importer not in converter_users):
            problems.append(f"{e.importer}:{e.line} imports the converter ({e.imported}); only "
                            f"{', '.join(converter_users)} may (the runtime must not depend on it)")
    problems += ["import cycle: " + " -> ".join(c) for c in find_cycles(edges)]
    return problems


# ------------------------------------------------------------------------------------------ the tree


def test_the_package_imports_one_way():
    problems = check(PACKAGES, LAYERS)
    assert not problems, "\n".join(problems)


def test_every_module_was_read():
    modules = find_modules(PACKAGES)
    # the layers the rule is about are all there (a broken walk would pass the test above vacuously)
    for name in ("hsgds", "hsgds.format", "hsgds.io.posix", "hsgds.io.kvikio_reader", "hsgds.ring",
                 "hsgds.engines.torch_engine", "hsgds.loader", "hsgds.cli", "hsgds.preprocess.convert",
                 "hsgds.preprocess.readers.base"):
        assert name in modules, name
    assert "hsgds.preprocess.convert" not in {n for n in modules if modules[n].is_relative_to(ROOT / "hsgds")}
    edges = [e for name, file in modules.items() for e in import_edges(name, file, modules)[0]]
    assert Edge("hsgds.loader", "hsgds.ring", _line_of("hsgds/loader.py", "from hsgds.ring import"), False) in edges
    # a function-level import counts (the loader probes the machine when it is built)
    assert any(e.importer == "hsgds.loader" and e.imported == "hsgds.probe" for e in edges)
    assert any(e.importer == "hsgds.cli" and e.imported.startswith("hsgds.preprocess") for e in edges)


def _line_of(path: str, text: str) -> int:
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(text))


# ------------------------------------------------------------------------------------------ the checker


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return {"hsgds": tmp_path / "hsgds", "hsgds.preprocess": tmp_path / "preprocess"}


TOY_LAYERS = [("base", ("hsgds.errors",)), ("format", ("hsgds.format",)), ("converter", ("hsgds.preprocess.*",)),
              ("io", ("hsgds.io.*",)), ("apps", ("hsgds", "hsgds.cli", "hsgds.loader"))]


def test_checker_accepts_a_clean_tree(tmp_path):
    packages = _tree(tmp_path, {
        "hsgds/__init__.py": "from hsgds.errors import E\n",
        "hsgds/errors.py": "class E(Exception): ...\n",
        "hsgds/format.py": "from .errors import E\nimport numpy\n",
        "hsgds/io/__init__.py": "from hsgds.io.posix import R\n",
        "hsgds/io/posix.py": "from hsgds import format as fmt\nclass R: ...\n",
        "hsgds/cli.py": "def convert():\n    from hsgds.preprocess.convert import run\n",
        "hsgds/loader.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hsgds.cli import x\n",
        "preprocess/__init__.py": "",
        "preprocess/convert.py": "from hsgds.format import x\nfrom . import helpers\n",
        "preprocess/helpers.py": "",
    })
    assert check(packages, TOY_LAYERS) == []


def test_checker_finds_upward_imports_cycles_and_strays(tmp_path):
    packages = _tree(tmp_path, {
        "hsgds/__init__.py": "",
        "hsgds/errors.py": "",
        "hsgds/format.py": "def f():\n    from hsgds.io import posix  # upward, inside a function\n",
        "hsgds/io/__init__.py": "",
        "hsgds/io/posix.py": "from hsgds.io import kvikio\n",
        "hsgds/io/kvikio.py": "from . import posix  # a cycle within one layer\n",
        "hsgds/loader.py": "from hsgds.preprocess import convert  # the runtime reaching the converter\n"
                           "import hsgds.device  # gone\n",
        "hsgds/stray.py": "",
        "preprocess/__init__.py": "",
        "preprocess/convert.py": "from hsgds.io.posix import R  # the converter reaching the runtime\n",
    })
    problems = check(packages, TOY_LAYERS)
    expected = [
        "hsgds.format:2 imports hsgds.io.posix: upward, from layer 'format' into 'io'",
        "hsgds.preprocess.convert:1 imports hsgds.io.posix: upward, from layer 'converter' into 'io'",
        "hsgds.loader:1 imports the converter (hsgds.preprocess.convert); "
        "only hsgds.cli, hsgds.preprocess.convert_many may",
        "hsgds.loader:2: `import hsgds.device`: no such module in the project",
        "hsgds.stray (hsgds/stray.py) is in no layer",
        "import cycle: hsgds.io.kvikio -> hsgds.io.posix -> hsgds.io.kvikio",
    ]
    for line in expected:
        assert any(p.startswith(line) for p in problems), (line, problems)
    assert len(problems) == len(expected), problems


def test_type_checking_imports_skip_the_cycle_check_but_not_the_layers(tmp_path):
    packages = _tree(tmp_path, {
        "hsgds/__init__.py": "",
        "hsgds/errors.py": "import typing\nif typing.TYPE_CHECKING:\n    from hsgds.format import F\n",
        "hsgds/format.py": "from hsgds.errors import E\n",
        "hsgds/cli.py": "from hsgds.loader import L\n",
        "hsgds/loader.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hsgds.cli import C\n",
        "preprocess/__init__.py": "",
    })
    assert check(packages, TOY_LAYERS) == [
        "hsgds.errors:3 imports hsgds.format: upward, from layer 'base' into 'format'"]
