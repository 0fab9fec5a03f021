"""The settings every rank's PatchLoader must share, compared across a torch.distributed process group.

Each rank plans its own share of an epoch from its own settings, so ranks built differently (a seed per
rank, another batch size, split or store) read overlapping or missing samples, or yield different batch
counts and leave DDP waiting at the epoch's end. A loader sharded over the group therefore compares its
settings with every other rank's when an iteration starts: one ``all_gather`` of a fixed-size byte tensor
per rank (JSON of the settings), after which every rank holds every rank's settings and, where they differ,
every rank raises the same one-line ConfigError (none is left waiting in a collective). The same gather carries
each loader's rank, the share it reads: ranks must read one share each (a rank given LOCAL_RANK on a multi-node
job, or one rank given to all, reads another's share twice and leaves one unread). About 1.4 ms with two gloo
ranks on one host (0.9 ms the gather, 0.05 ms the settings and their JSON), once per epoch.

A plain tensor rather than ``all_gather_object``: no pickle from the peers, one collective instead of two,
and a device chosen here: the CPU when the group has a CPU backend (gloo), else the loader's own GPU (NCCL
takes only CUDA tensors, on the rank's GPU; that is the loader's device, even when ``torch.cuda.set_device``
was not called), else the current CUDA device.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from hsgds._wording import listed, runs
from hsgds.errors import ConfigError, HsgdsError, one_line, shown

#: bytes of each rank's settings in the gather; the settings (long values sent as digests) take under 2 KiB
PAYLOAD_BYTES = 4096
_LONG = 120  # a longer value (an Augment's repr, a list of bands) is compared by its digest
_VALUES_SHOWN = 4  # distinct values named in the message; more are counted
_RUNS_SHOWN = 6  # runs of ranks named for a value; more are counted (the message stays one short line)

SAME_SETTINGS = "every rank must build PatchLoader with the same settings (only rank and world_size differ)"
#: the key each rank's own ``rank`` (the share it reads) travels under in the gather, beside the settings
SHARE = "rank"


def compared(value: Any) -> Any:
    """``value`` as it is sent: JSON scalars as they are, anything else as its repr, a long one as its digest."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= _LONG:
        return text
    return f"{text[:40]}... (sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]})"


def encoded(settings: dict[str, Any]) -> bytes:
    """The settings as the fixed-size payload: UTF-8 JSON of (name, value) pairs, NUL-padded (JSON escapes a
    NUL inside a string, so the padding is never part of it)."""
    data = json.dumps([[name, compared(v)] for name, v in settings.items()]).encode()
    if len(data) > PAYLOAD_BYTES:  # the values are short or digests: only a new setting could do this
        raise AssertionError(f"{len(data)} bytes of loader settings exceed PAYLOAD_BYTES={PAYLOAD_BYTES}")
    return data.ljust(PAYLOAD_BYTES, b"\0")


def decoded(payload: bytes) -> dict[str, Any]:
    return {name: value for name, value in json.loads(payload.rstrip(b"\0").decode())}


def _ranks(ranks: list[int]) -> str:
    """"rank 3", "ranks 0-2, 5", "ranks 0, 2, 4, 6, 8, 10 and 494 more" (runs of consecutive ranks)."""
    text = listed((str(a) if a == b else f"{a}-{b}" for a, b in runs(ranks)), _RUNS_SHOWN)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def disagreement(each: list[dict[str, Any]], labels: dict[str, str], fixes: dict[str, str]) -> str | None:
    """The one-line message naming the first setting (in rank 0's order) the ranks' settings ``each`` differ on
    and every rank's value, or None when they agree. ``labels``: how a setting is named, where not by its key;
    ``fixes``: what to do, where more specific than :data:`SAME_SETTINGS`."""
    missing = object()
    for name in dict.fromkeys(k for settings in each for k in settings):  # rank 0's first
        values = [settings.get(name, missing) for settings in each]
        if all(v == values[0] and type(v) is type(values[0]) for v in values):
            continue
        groups: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            groups.setdefault("no such setting" if v is missing else shown(v), []).append(r)
        said = [f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {v}" for v, rs in groups.items()]
        more = len(said) - _VALUES_SHOWN
        text = ", ".join(said[:_VALUES_SHOWN]) + (f" and {more} other values" if more > 0 else "")
        return f"ranks disagree on {labels.get(name, name)}: {text}; {fixes.get(name, SAME_SETTINGS)}"
    return None


def share_clash(shares: list[int]) -> str | None:
    """The one-line message when the loaders' ranks ``shares`` (one per group rank, in group order) are not a
    permutation of 0..W-1, or None when they are: ranks that chose the same share read its samples twice, and the
    shares none chose are never read (a rank given LOCAL_RANK on a multi-node job, or the same rank on every one)."""
    chosen: dict[int, list[int]] = {}
    for group_rank, share in enumerate(shares):
        chosen.setdefault(share, []).append(group_rank)
    twice = [(share, rs) for share, rs in sorted(chosen.items()) if len(rs) > 1]
    if not twice:
        return None
    said = [f"group {_ranks(rs)} chose rank={share}" for share, rs in twice]
    more = len(said) - _VALUES_SHOWN
    text = ", ".join(said[:_VALUES_SHOWN]) + (f" and {more} other shares were chosen by several" if more > 0 else "")
    unread = [s for s in range(len(shares)) if s not in chosen]
    unread_text = listed((str(a) if a == b else f"{a}-{b}" for a, b in runs(unread)), _RUNS_SHOWN)
    none = f"share {unread_text} is" if len(unread) == 1 else f"shares {unread_text} are"
    return (f"each rank must read its own share (PatchLoader rank= 0..{len(shares) - 1}, each once), but {text}, so "
            f"{none} read by no rank (missing from training while others are read twice); pass "
            "rank=torch.distributed.get_rank() (not LOCAL_RANK, which repeats on every node), or neither rank nor "
            "world_size to take torch.distributed's")


def gather_device(loader_device: torch.device, backend_config: str) -> torch.device:
    """Where the gathered tensor lives, for the group's ``torch.distributed.get_backend_config()`` (e.g.
    "cpu:gloo,cuda:gloo", "cuda:nccl"): the CPU when the group has a CPU backend (gloo, and torch's default
    "cpu:gloo,cuda:nccl"), else the loader's GPU, else the current CUDA device (NCCL with a CPU loader)."""
    types = [part.split(":")[0] for part in backend_config.split(",") if ":" in part]
    if "cpu" in types or not types:
        return torch.device("cpu")
    if loader_device.type in types:
        return loader_device
    return torch.device(types[0], torch.cuda.current_device()) if types[0] == "cuda" else torch.device(types[0])


def compare_across_ranks(settings: dict[str, Any], share: int, loader_device: torch.device,
                         labels: dict[str, str], fixes: dict[str, str],
                         carried: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Gather every rank's ``settings`` and ``share`` (its loader's rank; one all_gather over the default group)
    and raise the same ConfigError on every rank when the settings differ (:func:`disagreement`), or else when
    two ranks read the same share (:func:`share_clash`). Every rank of the group must call it: a rank that
    never does leaves the others waiting until the group's own timeout, which is raised as an HsgdsError saying
    so (no timeout of our own: a slow rank, still loading its model, must not fail the others).

    ``carried``: values the same gather collects but does not compare (a rank's ring size, which orders its own
    share only). Returns every share's ``carried`` values, in share order (the shares are 0..W-1 once
    :func:`share_clash` passed; a value a peer did not send is None)."""
    dist = torch.distributed
    device = gather_device(loader_device, str(dist.get_backend_config()))
    carried = {SHARE: share, **(carried or {})}
    mine = torch.frombuffer(bytearray(encoded({**settings, **carried})), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    try:
        dist.all_gather(gathered, mine)
    except Exception as e:  # torch's own says only "Timed out waiting 1800000ms for send operation to complete"
        raise HsgdsError(f"rank {dist.get_rank()} could not compare this PatchLoader's settings with the other ranks' "
                         f"({one_line(e, 160)}): every rank must iterate a loader sharded over the process group "
                         "together (one that never iterates it, or has failed, leaves the others waiting until the "
                         "group's timeout); to read a loader on some ranks only, build it with rank=0, "
                         "world_size=1") from e
    rows = torch.stack(gathered).cpu().numpy()  # one copy from the device, not one per rank
    each = [decoded(row.tobytes()) for row in rows]
    # (a peer of another hsgds, without some of them: its version is named)
    theirs = [{name: settings.pop(name, None) for name in carried} for settings in each]
    shares = [values[SHARE] for values in theirs]
    message = disagreement(each, labels, fixes) or share_clash(shares)
    if message is not None:
        raise ConfigError(message)
    return sorted(theirs, key=lambda values: values[SHARE])
