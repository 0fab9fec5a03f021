"""hsgds.defaults (get / set / context manager / environment) and docs/settings.md checked against the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hsgds import defaults
from hsgds.errors import ConfigError

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
    if isinstance(value, bool):
        return "true" if value else "false"
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


@pytest.fixture
def env(hsgds_env):
    return hsgds_env


def test_get_prefers_override_then_environment_then_default(env):
    env("HSGDS_KVIKIO_THREADS", None)
    assert defaults.get("kvikio_threads") == 0
    env("HSGDS_KVIKIO_THREADS", "6")
    assert defaults.get("kvikio_threads") == 6  # parsed to the setting's type
    env("HSGDS_KVIKIO_THREADS", "")
    assert defaults.get("kvikio_threads") == 0  # empty = unset
    env("HSGDS_KVIKIO_THREADS", "6")
    with defaults.set(kvikio_threads=2):
        assert defaults.get("kvikio_threads") == 2
    assert defaults.get("kvikio_threads") == 6


def test_environment_is_read_once(env, monkeypatch):
    env("HSGDS_RING_POLL_S", "0.5")
    assert defaults.get("ring_poll_s") == 0.5
    monkeypatch.setenv("HSGDS_RING_POLL_S", "0.25")  # after the first use: not seen ...
    assert defaults.get("ring_poll_s") == 0.5
    defaults.reload()  # ... until the environment is read again
    assert defaults.get("ring_poll_s") == 0.25


def test_nothing_is_read_at_import_time(tmp_path):
    # a bad value breaks only the use of its setting, not `import hsgds` (nor the other settings)
    code = ("import hsgds, hsgds.defaults as d\n"
            "print(d.get('device'))\n"
            "try:\n    d.get('read_inflight')\nexcept hsgds.ConfigError as e:\n    print('error:', e)\n")
    env = {**os.environ, "HSGDS_READ_INFLIGHT": "many", "HSGDS_DEVICE": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "cpu", "error: HSGDS_READ_INFLIGHT='many' is not an integer >= 1; fix or unset it (see docs/settings.md; "
        "default: 4)"]


@pytest.mark.parametrize("text, value", [("1", True), ("0", False), ("true", True), ("False", False),
                                         ("YES", True), ("no", False), ("on", True), (" off ", False)])
def test_booleans_are_parsed(env, text, value):
    env("HSGDS_TRITON", text)
    assert defaults.get("triton") is value
    with defaults.set(triton=text):
        assert defaults.get("triton") is value


def test_every_default_is_a_valid_value():
    for name in defaults.names():
        value = defaults.default(name)
        with defaults.set(**{name: value}):
            assert defaults.get(name) == value
        with defaults.set(**{name: _as_written(value) if not isinstance(value, str) else value}):
            assert defaults.get(name) == value, name  # the documented text means the default


def test_set_as_context_manager_nests_and_restores(env):
    env("HSGDS_DEVICE", None)
    with defaults.set(device="cpu", kvikio_threads=3):
        assert (defaults.get("device"), defaults.get("kvikio_threads")) == ("cpu", 3)
        with defaults.set(device="cuda:1"):
            assert defaults.get("device") == "cuda:1"
        assert defaults.get("device") == "cpu"
        with pytest.raises(RuntimeError), defaults.set(device="cuda"):
            raise RuntimeError("restored even when the block fails")
        assert defaults.get("device") == "cpu"
    assert (defaults.get("device"), defaults.get("kvikio_threads")) == ("auto", 0)


def test_set_without_with_lasts_until_undone(env):
    env("HSGDS_DEVICE", None)
    override = defaults.set(device="cpu")
    try:
        assert defaults.get("device") == "cpu"
    finally:
        override.__exit__(None, None, None)
    assert defaults.get("device") == "auto"


def test_unknown_setting_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown hsgds setting 'gpu'.*device"):
        defaults.get("gpu")
    with pytest.raises(ConfigError, match=r"unknown hsgds setting\(s\) \['gpu'\]"):
        defaults.set(gpu=1)
    with pytest.raises(ConfigError, match="unknown hsgds setting 'gpu'"):
        defaults.env_var("gpu")


@pytest.mark.parametrize("name, bad", [("triton", "maybe"), ("read_inflight", "0"), ("read_inflight", "2.5"),
                                       ("ring_gpu_fraction", "0"), ("ring_gpu_fraction", "1.5"),
                                       ("ring_poll_s", "nan"), ("kvikio_threads", "-1")])
def test_bad_environment_value_is_a_config_error(env, name, bad):
    var = defaults.env_var(name)
    env(var, bad)
    with pytest.raises(ConfigError, match=f"{var}='{re.escape(bad)}' is not .*docs/settings.md"):
        defaults.get(name)


def test_bad_value_given_to_set_changes_nothing(env):
    env("HSGDS_READ_INFLIGHT", None)
    with pytest.raises(ConfigError, match="read_inflight=0 is not an integer >= 1"):
        defaults.set(device="cpu", read_inflight=0)
    with pytest.raises(ConfigError, match="triton=2 is not a boolean"):
        defaults.set(triton=2)
    with pytest.raises(ConfigError, match="torch_threads=True is not an integer"):
        defaults.set(torch_threads=True)
    assert (defaults.get("device"), defaults.get("read_inflight")) == ("auto", 4)


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "gpu0", 3])
def test_a_device_that_is_none_is_refused_where_it_is_given(env, bad):
    with pytest.raises(ConfigError, match=f"setting device={re.escape(repr(bad))} is not 'auto', 'cpu', 'cuda'"):
        defaults.set(device=bad)
    env("HSGDS_DEVICE", str(bad))
    with pytest.raises(ConfigError, match=f"HSGDS_DEVICE='{bad}' is not 'auto'"):
        defaults.get("device")
    env("HSGDS_DEVICE", " CUDA:1 ")
    assert defaults.get("device") == "cuda:1"


def test_an_invalid_device_variable_stops_the_loader_instead_of_meaning_auto(env, tile_store):
    env("HSGDS_DEVICE", "gpu")
    with pytest.raises(ConfigError, match="HSGDS_DEVICE='gpu' is not 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        import hsgds

        hsgds.PatchLoader(tile_store, patch_size=3, batch_size=4)


def test_a_device_given_to_set_is_named_so_in_errors(env):
    from hsgds.choice import choose
    from hsgds.probe import DeviceReport

    with defaults.set(device="cuda"), pytest.raises(ConfigError, match=r"defaults.set\(device='cuda'\) but CUDA is not"):
        choose(DeviceReport(device_setting="cuda"))


def test_ring_cpu_bytes_caps_the_default_ring(indian_pines_store):
    from hsgds.loader import PatchLoader
    from hsgds.scene import open_scene

    tile = open_scene(indian_pines_store).grid.tile_nbytes
    with defaults.set(device="cpu"):
        with PatchLoader(indian_pines_store, patch_size=5, batch_size=8, split=None) as loader:
            whole = loader.slots  # the whole split fits under the default 2 GiB
        with defaults.set(ring_cpu_bytes=3 * tile), \
                PatchLoader(indian_pines_store, patch_size=5, batch_size=8, split=None) as loader:
            assert loader.slots == 3 < whole
