"""docker/: the Dockerfile and compose files checked statically (no Docker engine is needed)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
CUDA13_RUNTIME = re.compile(r"^nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu\d+\.\d+@sha256:[0-9a-f]{64}$")


@dataclass
class Stage:
    base: str  # the FROM reference, ARGs substituted
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)
    args: dict[str, str] = field(default_factory=dict)

    def all(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Joins continuation lines, drops comments and parser directives."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []

    def subst(value: str, scope: dict[str, str]) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: scope.get(m[1] or m[2], m[0]), value)

    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if instruction == "ARG":
            name, _, default = rest.partition("=")
            (stages[-1].args if stages else global_args)[name] = default.strip('"')
        if instruction == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=subst(parts[0], global_args), name=name))
        elif stages:
            stages[-1].instructions.append((instruction, rest))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile((DOCKER / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def compose():
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_parser_handles_continuations_and_args():
    text = "# c\nARG B=img:1@sha256:" + "a" * 64 + "\nFROM ${B} AS x\nRUN a \\\n  # note\n  && b\nUSER 5\n"
    args, stages = parse_dockerfile(text)
    assert args == {"B": "img:1@sha256:" + "a" * 64}
    assert stages[0].base == args["B"] and stages[0].name == "x"
    assert stages[0].instructions == [("RUN", "a  && b"), ("USER", "5")]


def test_every_base_is_pinned_cuda13_runtime_by_tag_and_digest(dockerfile):
    _, stages = dockerfile
    names = {s.name for s in stages if s.name}
    assert len(stages) >= 1
    for stage in stages:
        if stage.base in names:
            continue  # FROM an earlier stage
        assert "$" not in stage.base, f"unresolved ARG in FROM {stage.base}"
        assert DIGEST.search(stage.base), f"FROM {stage.base} is not pinned by digest"
        assert CUDA13_RUNTIME.match(stage.base), f"FROM {stage.base} is not a CUDA 13 runtime image with a tag"
        assert ":latest" not in stage.base
    assert CUDA13_RUNTIME.match(stages[-1].base)  # what ships is the runtime image, not devel


def test_no_latest_anywhere():
    for name in ("Dockerfile", "compose.yaml", "compose.gds.yaml"):
        text = (DOCKER / name).read_text()
        assert not re.search(r":latest\b", text), f"docker/{name} uses a 'latest' tag"


def test_runs_as_a_created_non_root_user(dockerfile):
    _, stages = dockerfile
    final = stages[-1]
    users = final.all("USER")
    assert users, "the final stage has no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    created = " ".join(final.all("RUN"))
    m = re.search(rf"useradd\b[^&;]*--uid\s+\"?\$\{{?(\w+)\}}?\"?[^&;]*\b{re.escape(user)}\b", created)
    assert m, f"user {user} is not created with useradd --uid in the final stage"
    uid = final.args.get(m.group(1))
    assert uid is not None and int(uid) > 0
    # nothing after USER switches back to root
    after = final.instructions[[i for i, _ in final.instructions].index("USER"):]
    assert not any(i == "USER" and a.split(":")[0] in ("root", "0") for i, a in after)


def test_healthcheck_is_hsgds_doctor(dockerfile):
    _, stages = dockerfile
    checks = stages[-1].all("HEALTHCHECK")
    assert len(checks) == 1
    cmd = checks[0].split("CMD", 1)[1]
    assert re.search(r'"hsgds",\s*"doctor"', cmd) or "hsgds doctor" in cmd
    assert "--require-gpu" in cmd
    assert re.search(r"--timeout=\d+s", checks[0]) and re.search(r"--interval=\d+m", checks[0])


def test_installs_the_local_checkout_with_cu13(dockerfile):
    _, stages = dockerfile
    copies = {}  # destination -> stage of `COPY . <dest>`
    installs = []
    for stage in stages:
        for instruction, rest in stage.instructions:
            if instruction == "COPY" and not rest.startswith("--from"):
                src, dest = rest.split()[0], rest.split()[-1]
                if src == ".":
                    copies[dest.rstrip("/")] = stage
            if instruction == "RUN":
                for command in re.split(r"&&|;", rest):
                    words = shlex.split(command)
                    if words[:2] == ["pip", "install"] or words[1:3] == ["-m", "pip"]:
                        installs.append((stage, words))
    assert copies, "the checkout is never copied into the image (COPY . <dir>)"
    local = []
    for stage, words in installs:
        for word in words[2:]:
            assert not re.match(r"^hsgds($|[\[=<>~!])", word), f"hsgds installed from an index: {word}"
            target = re.sub(r"\$\{(\w+)\}", lambda m, stage=stage: stage.args.get(m[1], m[0]), word)
            path, _, extras = target.partition("[")
            if path.rstrip("/") in copies:
                local.append(extras.rstrip("]").split(","))
    assert local, "no pip install of the copied checkout"
    assert any("cu13" in extras for extras in local), f"the checkout is installed without [cu13]: {local}"
    # the runtime stage takes the built venv from the build stage, not a second install
    final = stages[-1]
    assert any(a.startswith("--from=") for a in final.all("COPY"))
    torch = [w for _, words in installs for w in words if w.startswith("torch==")]
    assert torch and "TORCH_VERSION" in torch[0], "torch is installed at the pinned TORCH_VERSION"
    build_args = {k: v for s in stages for k, v in s.args.items()}
    assert re.fullmatch(r"\d+\.\d+\.\d+", build_args["TORCH_VERSION"])


def test_dockerignore_keeps_the_context_small():
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    for entry in (".git", ".venv", "**/*.zarr", "**/__pycache__"):
        assert entry in ignored


def _volumes(service: dict) -> list[dict]:
    """Volumes in long form: {type, source, target, read_only}."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            out.append({"type": "bind", "source": parts[0], "target": parts[1],
                        "read_only": len(parts) > 2 and "ro" in parts[2].split(",")})
        else:
            out.append(v)
    return out


def test_compose_reserves_gpus(compose):
    service = compose["services"]["hsgds"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    assert gpus, "no NVIDIA GPU reservation"
    assert gpus[0].get("count") == "all" or int(gpus[0].get("count", 0)) > 0 or gpus[0].get("device_ids")


def test_compose_builds_this_checkout_with_this_dockerfile(compose):
    build = compose["services"]["hsgds"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    assert ":latest" not in compose["services"]["hsgds"].get("image", "")


def test_compose_mounts_what_gds_needs(compose):
    service = compose["services"]["hsgds"]
    volumes = {v["target"]: v for v in _volumes(service)}
    udev = volumes.get("/run/udev")
    assert udev and udev["source"] == "/run/udev" and udev.get("read_only") is True
    data = volumes.get("/data")
    assert data and data.get("type", "bind") == "bind", "the stores must be a bind mount of the NVMe directory"
    assert "${NVME_DATA" in data["source"] and ":?" in data["source"]  # required, with a message
    assert service["ulimits"]["memlock"] in (-1, {"soft": -1, "hard": -1})
    assert service["environment"]["HSGDS_CACHE_DIR"].startswith("/data")
    assert "healthcheck" not in service or "doctor" in str(service["healthcheck"])


def test_compose_gds_override():
    yaml = pytest.importorskip("yaml")
    service = yaml.safe_load((DOCKER / "compose.gds.yaml").read_text())["services"]["hsgds"]
    devices = [d.split(":")[0] for d in service["devices"]]
    assert devices == [f"/dev/nvidia-fs{i}" for i in range(16)]
    cufile = {v["target"]: v for v in _volumes(service)}["/etc/cufile.json"]
    assert cufile["read_only"] is True


def test_readme_states_the_digest_and_the_build_status(dockerfile):
    args, _ = dockerfile
    digest = args["CUDA_IMAGE"].split("@")[1]
    readme = (DOCKER / "README.md").read_text()
    assert digest in readme, "docker/README.md must name the digest the Dockerfile pins"
    assert "How this was last built and run" in readme
    for setting in ("NVME_DATA", "/run/udev", "memlock", "/dev/nvidia-fs", "HEALTHCHECK", "UID"):
        assert setting in readme
