"""hsgds.defaults (get / set / context manager / environment) and docs/settings.md checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hsgds import defaults

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "settings.md"
# where HSGDS_* variables may be read or set: the packages, the tools and the deployment files
SOURCES = ("hsgds", "preprocess", "benchmarks", "docker", ".ci", "Makefile")
_ROW = re.compile(r"^\|\s*`(?P<name>[a-z_0-9]+)`\s*\|\s*`(?P<var>[A-Z_0-9]+)`\s*\|\s*`(?P<default>[^`]*)`\s*\|")


def documented_settings() -> dict[str, tuple[str, str]]:
    """The rows of the `hsgds.defaults` table: name -> (environment variable, default as written)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## `hsgds.defaults`", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = _ROW.match(line)
        if m:
            assert m["name"] not in rows, f"{m['name']} is listed twice in {DOC}"
            rows[m["name"]] = (m["var"], m["default"])
    return rows


def _as_written(value: object) -> str:
    text = str(value)
    home = str(Path.home())
    return "~" + text[len(home):] if text.startswith(home + "/") else text


def test_every_setting_is_documented_with_its_variable_and_default():
    rows = documented_settings()
    assert sorted(rows) == defaults.names(), (
        f"docs/settings.md lists {sorted(rows)} but hsgds.defaults has {defaults.names()}")
    for name, (var, written) in rows.items():
        assert var == defaults.env_var(name), f"{name}: documented as {var}, code uses {defaults.env_var(name)}"
        assert var.startswith("HSGDS_")
        assert written == _as_written(defaults.default(name)), (
            f"{name}: documented default {written!r}, code default {defaults.default(name)!r}")


def test_no_undocumented_hsgds_variable_in_the_sources():
    doc = DOC.read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for top in SOURCES:
        base = ROOT / top
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()] if base.is_dir() else []
        for path in files:
            if "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for var in re.findall(r"\bHSGDS_[A-Z0-9_]*[A-Z0-9]\b", text):
                found.setdefault(var, str(path.relative_to(ROOT)))
    assert "HSGDS_DEVICE" in found  # the scan works
    missing = {var: where for var, where in found.items() if f"`{var}`" not in doc}
    assert not missing, f"HSGDS_* variables used but not in docs/settings.md: {missing}"


def test_get_prefers_override_then_environment_then_default(monkeypatch):
    monkeypatch.delenv("HSGDS_KVIKIO_THREADS", raising=False)
    assert defaults.get("kvikio_threads") == 0
    monkeypatch.setenv("HSGDS_KVIKIO_THREADS", "6")
    assert defaults.get("kvikio_threads") == 6  # parsed to the setting's type
    monkeypatch.setenv("HSGDS_KVIKIO_THREADS", "")
    assert defaults.get("kvikio_threads") == 0  # empty = unset
    monkeypatch.setenv("HSGDS_KVIKIO_THREADS", "6")
    with defaults.set(kvikio_threads=2):
        assert defaults.get("kvikio_threads") == 2
    assert defaults.get("kvikio_threads") == 6


def test_set_as_context_manager_nests_and_restores(monkeypatch):
    monkeypatch.delenv("HSGDS_DEVICE", raising=False)
    with defaults.set(device="cpu", kvikio_threads=3):
        assert (defaults.get("device"), defaults.get("kvikio_threads")) == ("cpu", 3)
        with defaults.set(device="cuda:1"):
            assert defaults.get("device") == "cuda:1"
        assert defaults.get("device") == "cpu"
        with pytest.raises(RuntimeError), defaults.set(device="cuda"):
            raise RuntimeError("restored even when the block fails")
        assert defaults.get("device") == "cpu"
    assert (defaults.get("device"), defaults.get("kvikio_threads")) == ("auto", 0)


def test_set_without_with_lasts_until_undone(monkeypatch):
    monkeypatch.delenv("HSGDS_DEVICE", raising=False)
    override = defaults.set(device="cpu")
    try:
        assert defaults.get("device") == "cpu"
    finally:
        override.__exit__(None, None, None)
    assert defaults.get("device") == "auto"


def test_unknown_setting_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown hsgds setting 'gpu'.*device"):
        defaults.get("gpu")
    with pytest.raises(KeyError, match=r"unknown hsgds setting\(s\) \['gpu'\]"):
        defaults.set(gpu=1)


def test_bad_environment_value_is_a_config_error(monkeypatch):
    from hsgds import defaults
    from hsgds.errors import ConfigError

    monkeypatch.setenv("HSGDS_TRITON", "yes")
    with pytest.raises(ConfigError, match="HSGDS_TRITON='yes' is not a valid int"):
        defaults.get("triton")
