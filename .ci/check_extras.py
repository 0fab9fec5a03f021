#!/usr/bin/env python3
"""Check that hsgds's GPU extras resolve, without a GPU and without installing anything.

    python .ci/check_extras.py            # from the repository root; needs the package index (network)

Each check is ``pip install --dry-run --ignore-installed --report``: pip resolves the whole dependency
tree from package metadata and writes what it would install as JSON, which is then checked. The index
serves no PEP 658 metadata for DALI, torch's CUDA build or the nvidia-* libraries, so plain pip downloads
those wheels whole (~5 GB on disk at once, which once failed CI with "No space left on device");
``--use-feature=fast-deps`` reads only each wheel's METADATA with HTTP range requests (peak ~15 MB; without
that feature the checks run one at a time). The checks:

1. ``.[cu12]`` and ``.[cu13]`` on this machine: kvikio and DALI of that CUDA major are in the
   plan, and hsgds itself comes from this checkout (a local directory), not from an index.
2. The Docker image's install (``torch==<TORCH_VERSION of docker/Dockerfile>`` + ``.[cu13]`` for Linux
   x86_64, Python 3.12 as in Ubuntu 24.04): torch and the cu13 libraries agree on one CUDA toolkit.
3. Native Windows: the extras' environment markers leave kvikio and DALI out (Linux-only), and what is
   left resolves to Windows wheels together with hsgds's own dependencies.

The checks run in parallel; about a minute with a warm pip cache. Exit 0 when all pass, 1 otherwise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: packages each GPU extra must bring on Linux
EXPECTED = {
    "cu12": {"kvikio-cu12", "nvidia-dali-cuda120"},
    "cu13": {"kvikio-cu13", "nvidia-dali-cuda130"},
}
#: Linux-only packages that the extras must leave out on native Windows
LINUX_ONLY = ("kvikio-", "nvidia-dali-")
# pip takes --platform tags literally: list every manylinux tag an Ubuntu 24.04 (glibc 2.39) image accepts
_LINUX_TAGS = ([f"manylinux_2_{v}_x86_64" for v in range(5, 40)]
               + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"])


def load_project(pyproject: Path = ROOT / "pyproject.toml") -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with open(pyproject, "rb") as f:
        return tomllib.load(f)["project"]


def load_extras(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, list[str]]:
    return load_project(pyproject)["optional-dependencies"]


def requirements_on(extra: str | None, extras: dict[str, list[str]], platform: str,
                    base: list[str] | None = None) -> list[Requirement]:
    """The requirements of ``extra`` (None: only ``base``) whose markers hold on ``platform`` ("linux" or
    "win32"); ``base`` (the project's dependencies) come first when given."""
    env = dict(default_environment())
    env.update(sys_platform=platform, platform_system={"linux": "Linux", "win32": "Windows"}[platform],
               os_name={"linux": "posix", "win32": "nt"}[platform], extra=extra or "")
    out = []
    for text in [*(base or []), *(extras[extra] if extra else [])]:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def docker_torch_version(dockerfile: Path = ROOT / "docker" / "Dockerfile") -> str:
    m = re.search(r"^ARG\s+TORCH_VERSION=(\S+)", dockerfile.read_text(), re.MULTILINE)
    if not m:
        raise SystemExit(f"{dockerfile}: no ARG TORCH_VERSION=...")
    return m.group(1)


def metadata_only() -> list[str]:
    """``--use-feature=fast-deps`` when this pip has it (an experimental feature a later pip may drop; pip
    checks the option before it shows --help), else nothing: the checks then download whole wheels and run
    one at a time, so that at most one plan's wheels are on disk at once."""
    cmd = [sys.executable, "-m", "pip", "install", "--use-feature=fast-deps", "--help"]
    ok = subprocess.run(cmd, capture_output=True).returncode == 0
    if not ok:
        print("note: this pip has no fast-deps; downloading whole wheels, one check at a time", file=sys.stderr)
    return ["--use-feature=fast-deps"] if ok else []


def dry_run(args: list[str], options: list[str]) -> tuple[dict | None, str]:
    """Run ``pip install --dry-run --ignore-installed --report`` with ``options`` and ``args``; (report or
    None, pip's stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", *options, "--report", str(report), *args]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 or not report.is_file():
            lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()
            return None, "\n".join(lines[-5:])
        return json.loads(report.read_text()), ""


def planned(report: dict) -> dict[str, dict]:
    """Canonical name -> install item of a pip report."""
    return {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}


def check_plan(report: dict, must_have: set[str], must_not_have: tuple[str, ...] = ()) -> list[str]:
    """Problems with a resolution plan: missing packages, forbidden ones, hsgds not from this checkout."""
    plan = planned(report)
    problems = [f"{name} is not in the plan" for name in sorted(must_have) if canonicalize_name(name) not in plan]
    problems += [f"{name} {plan[name]['metadata']['version']} would be installed"
                 for name in sorted(plan) if name.startswith(must_not_have)] if must_not_have else []
    item = plan.get("hsgds")
    if item is not None:
        info = item.get("download_info", {})
        if "dir_info" not in info or not str(info.get("url", "")).startswith("file:"):
            problems.append(f"hsgds would come from {info.get('url')}, not from this checkout")
    return problems


def main() -> int:
    project = load_project()
    extras = project["optional-dependencies"]
    torch_version = docker_torch_version()
    linux = [arg for tag in _LINUX_TAGS for arg in ("--platform", tag)]
    jobs: dict[str, tuple[list[str], set[str], tuple[str, ...]]] = {}
    for extra, names in EXPECTED.items():
        jobs[f".[{extra}] on this machine"] = ([f".[{extra}]"], names | {"hsgds"}, ())
    jobs[f"docker image: torch=={torch_version} + .[cu13], linux x86_64, py3.12"] = (
        [*linux, "--python-version", "3.12", "--only-binary=:all:", f"torch=={torch_version}", ".[cu13]"],
        EXPECTED["cu13"] | {"torch", "hsgds"}, ())
    problems: list[str] = []
    for extra in ("cpu", "dali", "cu12", "cu13"):
        own = [str(r) for r in requirements_on(extra, extras, "win32")]
        bad = [r for r in own if canonicalize_name(Requirement(r).name).startswith(LINUX_ONLY)]
        if bad:
            problems.append(f"[{extra}] on native Windows still asks for {bad} (Linux-only wheels)")
        # pip evaluates markers for the machine it runs on, not for --platform: resolve the requirements
        # that hold on Windows (the project's dependencies + the extra's) instead of ".[extra]"
        left = [str(r) for r in requirements_on(extra, extras, "win32", base=project["dependencies"])]
        names = {canonicalize_name(Requirement(r).name) for r in own}
        jobs[f"[{extra}] on native Windows (win_amd64, py3.11): {', '.join(own) or '-'}"] = (
            ["--platform", "win_amd64", "--python-version", "3.11", "--only-binary=:all:", *left],
            names, LINUX_ONLY)
    options = metadata_only()
    with ThreadPoolExecutor(max_workers=len(jobs) if options else 1) as pool:
        results = dict(zip(jobs, pool.map(lambda job: dry_run(job[0], options), jobs.values())))
    for label, (_, must_have, forbidden) in jobs.items():
        report, err = results[label]
        if report is None:
            problems.append(f"{label}: does not resolve:\n    " + err.replace("\n", "\n    "))
            continue
        found = [f"{label}: {p}" for p in check_plan(report, must_have, forbidden)]
        problems += found
        plan = planned(report)
        shown = ", ".join(f"{n} {plan[canonicalize_name(n)]['metadata']['version']}" for n in sorted(must_have)
                          if canonicalize_name(n) in plan)
        print(f"{'FAIL' if found else 'ok  '} {label}: {len(plan)} packages ({shown})")
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
