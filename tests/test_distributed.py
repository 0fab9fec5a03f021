"""Real torch.distributed processes (gloo, CPU): disjoint shards, complete union, equal batch counts; a resume
after one rank is killed; predict per rank."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    import hsgds

    store, rank, init, out, drop_last = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    with hsgds.PatchLoader(store, patch_size=5, batch_size=32, split=None, device="cpu", return_coords=True,
                           drop_last=drop_last, seed=11) as loader:
        assert (loader.rank, loader.world_size) == (rank, 2)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            n = len(loader)
            coords = [c.tolist() for _, _, c in loader]
            epochs.append({"len": n, "batches": len(coords), "coords": [p for b in coords for p in b]})
    dist.barrier()
    dist.destroy_process_group()
    json.dump(epochs, open(out, "w"))
""")


def _run_ranks(commands: list[list[str]], timeout: float = 120) -> list[subprocess.Popen]:
    """Start one process per command and wait for all; a rank that fails or outlives ``timeout`` (its peers
    would wait for it in a collective forever) fails the test with its stderr, the others killed, none left."""
    procs = [subprocess.Popen(c, stderr=subprocess.PIPE, text=True) for c in commands]
    try:
        for r, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} still running after {timeout} s (a collective waiting for a peer?)")
            assert p.returncode == 0, f"rank {r}: {err}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()  # closes its stderr pipe: one left open fails a later test (an unraisable warning)
    return procs



@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_gloo(tmp_path, indian_pines_store, drop_last):
    import hsgds

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    _run_ranks([[sys.executable, str(script), str(indian_pines_store), str(r), init, str(tmp_path / f"r{r}.json"),
                 "1" if drop_last else "0"] for r in range(2)])
    ranks = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    scene = hsgds.open_scene(indian_pines_store)
    y, x, _ = scene.samples(None)
    everything = set(zip(y.tolist(), x.tolist()))
    tile = scene.grid.tile
    for epoch in range(2):
        a, b = ranks[0][epoch], ranks[1][epoch]
        assert a["batches"] == b["batches"] == a["len"] == b["len"]
        tiles_a = {(yy // tile, xx // tile) for yy, xx in a["coords"]}
        tiles_b = {(yy // tile, xx // tile) for yy, xx in b["coords"]}
        assert len(tiles_a & tiles_b) <= 1  # each rank reads its own tiles, but for one on the cut between them
        pixels_a, pixels_b = {tuple(c) for c in a["coords"]}, {tuple(c) for c in b["coords"]}
        assert not pixels_a & pixels_b  # (padding repeats a rank's own samples)
        union = pixels_a | pixels_b
        if drop_last:
            assert union <= everything
            assert len(a["coords"]) == len(b["coords"]) == a["batches"] * 32 == len(everything) // 2 // 32 * 32
        else:
            assert union == everything
            # equal shares: at most one sample repeated
            assert len(a["coords"]) == len(b["coords"]) == -(-len(everything) // 2)
    assert ranks[0][0]["coords"] != ranks[0][1]["coords"]


PREDICT_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    import hsgds

    rank, world, init, stores, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:-1], sys.argv[-1]

    class CentreCoordinates(nn.Module):  # logits whose argmax is the centre pixel's y * W + x (bands 0, 1)
        def __init__(self, w):
            super().__init__()
            self.w = w

        def forward(self, x):
            c = x.shape[-1] // 2
            idx = x[:, 0, c, c].round().long() * self.w + x[:, 1, c, c].round().long()
            return nn.functional.one_hot(idx, 4096).float()

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for i in range(rank, len(stores), world):  # the scenes split among the ranks, each predicted whole
        w = hsgds.open_scene(stores[i]).shape[1]
        np.save(f"{out}/map{i}.npy", hsgds.predict(stores[i], CentreCoordinates(w), patch_size=3, batch_size=64,
                                                   device="cpu", normalize=None))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_predict_per_rank_maps_whole_scenes(tmp_path):
    """Ranks of a process group, each predicting its scenes of a collection, map every pixel of each scene: predict
    reads a scene as one rank, whatever torch.distributed's world size (its loader once took a rank's share)."""
    from hsgds.preprocess.convert import ConvertOptions
    from tests.conftest import convert_quietly

    stores, shapes = [], [(37, 29), (20, 45), (30, 30)]
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(shapes):
        cube = rng.integers(0, 1000, (h, w, 4)).astype(np.int16)
        cube[:, :, 0], cube[:, :, 1] = np.arange(h)[:, None], np.arange(w)[None, :]
        np.save(tmp_path / f"cube{i}.npy", cube)
        np.save(tmp_path / f"gt{i}.npy", rng.integers(0, 3, (h, w)).astype(np.uint8))
        stores.append(str(convert_quietly(tmp_path / f"cube{i}.npy", tmp_path / f"s{i}.zarr",
                                          ConvertOptions(labels=tmp_path / f"gt{i}.npy", tile=18))))
    script = tmp_path / "predict_worker.py"
    script.write_text(PREDICT_WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    _run_ranks([[sys.executable, str(script), str(r), "2", init, *stores, str(tmp_path)] for r in range(2)])
    for i, (h, w) in enumerate(shapes):  # each pixel's own index: every one predicted, by its own patch
        assert np.array_equal(np.load(tmp_path / f"map{i}.npy"), np.arange(h * w).reshape(h, w) + 1)


RESUME_WORKER = textwrap.dedent("""
    import hashlib, json, os, signal, sys
    import torch
    import torch.distributed as dist
    import hsgds

    rank, world, init, mode, work, augment = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                              sys.argv[5], sys.argv[6] == "1")
    stores = sys.argv[7:]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.1, band_dropout=0.05, mixture_noise=0.2)
    loader = hsgds.PatchLoader(stores, patch_size=5, batch_size=16, split=None, device="cpu", return_coords=True,
                               seed=7, augment=aug if augment else None)
    start = 0
    if mode == "resume":  # every rank loads rank 0's state, as the README's training loop does
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True)
        loader.load_state_dict(state)
        start = state["epoch"]
    batches = []
    for epoch in range(start, 3):
        loader.set_epoch(epoch)
        for x, y, c in loader:
            batches.append([epoch, c.tolist(), y.tolist(), hashlib.sha256(x.numpy().tobytes()).hexdigest()])
            if mode == "kill" and (epoch, loader.state_dict()["batch"]) == (1, 3):
                if rank == 0:
                    torch.save(loader.state_dict(), os.path.join(work, "state.pt"))
                json.dump(batches, open(os.path.join(work, f"kill{rank}.json"), "w"))
                dist.barrier()  # the state is written before any rank dies
                if rank == world - 1:
                    os.kill(os.getpid(), signal.SIGKILL)  # preempted
                dist.barrier()  # the others wait for it until the launcher kills them
    json.dump(batches, open(os.path.join(work, f"{mode}{rank}.json"), "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
    """Two seeded scenes of different sizes, several tiles each."""
    from hsgds.preprocess.convert import ConvertOptions
    from hsgds.synthetic import make_scene
    from tests.conftest import convert_quietly

    d = tmp_path_factory.mktemp("two")
    stores = []
    for i, (h, w) in enumerate([(40, 52), (33, 33)]):
        cube, labels = make_scene(h, w, 8, classes=4, dtype="int16", seed=i)
        np.save(d / f"cube{i}.npy", cube)
        np.save(d / f"gt{i}.npy", labels)
        stores.append(str(convert_quietly(d / f"cube{i}.npy", d / f"s{i}.zarr",
                                          ConvertOptions(labels=d / f"gt{i}.npy", tile=18))))
    return stores


@pytest.mark.parametrize("augment", [False, True])
def test_ranks_killed_mid_epoch_resume_bit_identical(tmp_path, two_stores, augment):
    """Two ranks over two scenes; the last rank is SIGKILLed mid-epoch (a preempted job), rank 0's saved state
    restarts both: together with what came before the kill, every rank yields what an uninterrupted run yields
    (coordinates, labels, patch bytes). A state of another world size is refused in one line."""
    import torch

    import hsgds
    from hsgds.errors import ConfigError

    script = tmp_path / "resume_worker.py"
    script.write_text(RESUME_WORKER)

    def command(mode: str, rank: int, init: str) -> list[str]:
        return [sys.executable, str(script), str(rank), "2", f"file://{tmp_path / init}", mode, str(tmp_path),
                "1" if augment else "0", *two_stores]

    _run_ranks([command("full", r, "rv_full") for r in range(2)])
    procs = [subprocess.Popen(command("kill", r, "rv_kill"), stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        assert procs[1].wait(timeout=120) == -signal.SIGKILL, procs[1].communicate()[1]
    finally:
        for p in procs:  # the launcher ends the survivors
            p.kill()
            p.communicate()
    _run_ranks([command("resume", r, "rv_resume") for r in range(2)])
    for r in range(2):
        full, before, after = (json.loads((tmp_path / f"{m}{r}.json").read_text()) for m in ("full", "kill", "resume"))
        assert before and after and before[-1][0] == after[0][0] == 1
        assert before + after == full
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    with hsgds.PatchLoader(two_stores, patch_size=5, batch_size=16, split=None, device="cpu", return_coords=True,
                           seed=7, rank=0, world_size=3,
                           augment=hsgds.Augment(flip=True, rot90=True, radiation_noise=0.1, band_dropout=0.05,
                                                 mixture_noise=0.2) if augment else None) as other:
        with pytest.raises(ConfigError, match=r"^loader state was saved with world_size=2 but this loader has "
                                              r"world_size=3; relaunch with 2 ranks to resume[^\n]*$"):
            other.load_state_dict(state)


EARLY_WORKER = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    import hsgds
    from hsgds.errors import ConfigError

    store, rank, init, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    loader = hsgds.PatchLoader(store, patch_size=5, batch_size=32, split=None, device="cpu")  # before init
    whole = hsgds.PatchLoader(store, patch_size=5, batch_size=32, split=None, device="cpu", rank=0, world_size=1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        next(iter(loader))
        said = "yielded"
    except ConfigError as e:
        said = str(e)
    n = sum(len(y) for _, y in whole)  # all of the split, as asked
    dist.barrier()
    dist.destroy_process_group()
    open(out, "w").write(f"{n}\\n{said}")
""")


def test_a_loader_built_before_init_process_group_is_refused(tmp_path, indian_pines_store):
    """A loader built before init_process_group took rank 0 of 1: iterated in a group of two it would give every rank
    the whole split (DDP trains on, on duplicated data); it is refused in one line. rank=0, world_size=1 given
    reads all of it."""
    import hsgds

    script = tmp_path / "early_worker.py"
    script.write_text(EARLY_WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    _run_ranks([[sys.executable, str(script), str(indian_pines_store), str(r), init, str(tmp_path / f"r{r}.txt")]
                for r in range(2)])
    everything = len(hsgds.open_scene(indian_pines_store).samples(None)[0])
    for r in range(2):
        n, said = (tmp_path / f"r{r}.txt").read_text().split("\n", 1)
        assert int(n) == everything
        assert said == ("this PatchLoader was built before torch.distributed was initialised, so each of the 2 ranks "
                        "would read the whole split; build it after init_process_group (each rank then reads its "
                        "share), or pass rank=0, world_size=1 to read all of it on purpose")


SETTINGS_WORKER = textwrap.dedent("""
    import hashlib, json, sys
    import torch
    import torch.distributed as dist
    import hsgds
    from hsgds.errors import ConfigError

    rank, init, out, mine, world = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    epochs, said = [], None
    if "norm_stats" in mine:  # a BandStats, as JSON lists
        mine["settings"]["norm_stats"] = hsgds.BandStats(**mine["norm_stats"])
    with hsgds.PatchLoader(mine["store"], patch_size=5, device="cpu", return_coords=True, **mine["settings"]) as loader:
        try:
            for epoch in mine["epochs"]:
                loader.set_epoch(epoch)
                batches = []
                for x, y, c in loader:
                    dist.all_reduce(torch.ones(1))  # as DDP's gradient all-reduce: the ranks step together
                    batches.append([c.tolist(), y.tolist(), hashlib.sha256(x.numpy().tobytes()).hexdigest()])
                epochs.append(batches)
        except ConfigError as e:
            said = str(e)
    dist.barrier()
    dist.destroy_process_group()
    json.dump({"said": said, "epochs": epochs}, open(out, "w"))
""")


def _run_settings(tmp_path, per_rank: list[dict]) -> list[dict]:
    """One gloo rank per entry of ``per_rank`` (store, settings, epochs), each building its loader from its own and
    stepping together as DDP does (an all-reduce per batch): each rank's error message, or its batches."""
    script = tmp_path / "settings_worker.py"
    script.write_text(SETTINGS_WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    # the harness's timeout ends a run whose ranks wait for each other (unequal batch counts) as a failure
    _run_ranks([[sys.executable, str(script), str(r), init, str(tmp_path / f"r{r}.json"), json.dumps(mine),
                 str(len(per_rank))] for r, mine in enumerate(per_rank)], timeout=60)
    return [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(len(per_rank))]


SAME = "every rank must build PatchLoader with the same settings (only rank and world_size differ)"


@pytest.mark.parametrize(("setting", "rank1", "said"), [
    ("seed", {"settings": {"seed": 8}}, f"ranks disagree on seed: rank 0 has 7, rank 1 has 8; {SAME}"),
    ("batch_size", {"settings": {"batch_size": 24}},
     f"ranks disagree on batch_size: rank 0 has 16, rank 1 has 24; {SAME}"),
    ("drop_last", {"settings": {"drop_last": True}},
     f"ranks disagree on drop_last: rank 0 has False, rank 1 has True; {SAME}"),
    ("split", {"settings": {"split": "test"}}, f"ranks disagree on split: rank 0 has 'train', rank 1 has 'test'; {SAME}"),
    ("store order", {"reversed": True},
     f"ranks disagree on the stores (in order): rank 0 has 's0, s1', rank 1 has 's1, s0'; {SAME}"),
    ("epoch", {"epochs": [1]}, "ranks disagree on the epoch: rank 0 has 0, rank 1 has 1; call loader.set_epoch(epoch) "
                               "with the same epoch on every rank"),
])
def test_ranks_built_with_different_settings_refuse_in_one_line(tmp_path, two_stores, setting, rank1, said):
    """Ranks of one process group whose loaders differ in a setting the shares depend on (a seed per rank, another
    batch size, drop_last, split, scene order, or a forgotten set_epoch) read overlapping or missing samples, or
    yield different batch counts and leave DDP waiting at the epoch's end (this test's timeout); instead every rank
    raises the same one-line ConfigError as the iteration starts, naming the setting and each rank's value, and
    yields nothing."""
    base = {"store": two_stores, "settings": {"batch_size": 16, "seed": 7, "split": "train"}, "epochs": [0]}
    other = {"store": two_stores[::-1] if rank1.get("reversed") else two_stores,
             "settings": {**base["settings"], **rank1.get("settings", {})}, "epochs": rank1.get("epochs", [0])}
    got = _run_settings(tmp_path, [base, other])
    for r in range(2):
        assert got[r] == {"said": said, "epochs": []}, (setting, r)


def test_ranks_built_alike_yield_what_each_share_yields_alone(tmp_path, two_stores):
    """The settings check changes nothing when the ranks agree: over two epochs each rank yields, bit for bit
    (coordinates, labels, patch bytes), what a loader given that rank and world size yields outside any group."""
    import hashlib

    import hsgds

    settings = {"batch_size": 16, "seed": 7, "split": None, "drop_last": False}
    got = _run_settings(tmp_path, [{"store": two_stores, "settings": settings, "epochs": [0, 1]}] * 2)
    for r in range(2):
        with hsgds.PatchLoader(two_stores, patch_size=5, device="cpu", return_coords=True, rank=r, world_size=2,
                               **settings) as alone:
            expected = []
            for epoch in range(2):
                alone.set_epoch(epoch)
                expected.append([[c.tolist(), y.tolist(), hashlib.sha256(x.numpy().tobytes()).hexdigest()]
                                 for x, y, c in alone])
        assert got[r] == {"said": None, "epochs": expected}
        assert len(expected[0]) == len(got[1 - r]["epochs"][0])


def test_ranks_normalizing_with_other_statistics_refuse_in_one_line(tmp_path, two_stores):
    """Ranks given other norm_stats (each computed its own, or one rank was given them and another not) normalized
    their patches differently and trained on inconsistent inputs, silently: the statistics were not compared. Now
    every rank raises the same one-line ConfigError naming them, with digests of the per-band offset and scale
    each applies (computed here with plain numpy). Statistics that normalize alike pass: rank 0's pooled over the
    scenes (norm_scope="collection") and the same numbers given to rank 1 as norm_stats."""
    import hashlib

    import hsgds

    with hsgds.PatchLoader(two_stores, patch_size=5, batch_size=16, split=None, device="cpu", rank=0, world_size=1,
                           norm_scope="collection") as pooled:
        stats = pooled.norm_stats
    given = {f: np.asarray(getattr(stats, f)).tolist() for f in ("mean", "std", "min", "max")}
    shifted = {**given, "mean": [m + 1.0 for m in given["mean"]]}  # another scene's statistics, say

    def digest(st: dict) -> str:  # zscore: (x - mean) / std, a constant band scaled by 1
        mean, std = np.asarray(st["mean"], np.float64), np.asarray(st["std"], np.float64)
        scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 1.0)
        return "sha256 " + hashlib.sha256(mean.tobytes() + scale.tobytes()).hexdigest()[:16]

    base = {"store": two_stores, "settings": {"batch_size": 16, "seed": 7, "split": None}, "epochs": [0]}
    label = "ranks disagree on the normalization statistics (digests of each band's offset and scale)"
    fix = ("pass every rank the same norm_stats= (e.g. rank 0's loader.norm_stats, broadcast) or none, and the same "
           "norm_scope")
    for run, (rank0, rank1, said) in enumerate([
        (given, shifted, f"{label}: rank 0 has '{digest(given)}', rank 1 has '{digest(shifted)}'; {fix}"),
        (given, None, f"{label}: rank 0 has '{digest(given)}', rank 1 has \"each scene's own\"; {fix}"),
    ]):
        (tmp_path / str(run)).mkdir()  # a group (its rendezvous file) per run
        per_rank = [{**base, **({} if st is None else {"norm_stats": st})} for st in (rank0, rank1)]
        assert _run_settings(tmp_path / str(run), per_rank) == [{"said": said, "epochs": []}] * 2
    alike = [{**base, "settings": {**base["settings"], "norm_scope": "collection"}}, {**base, "norm_stats": given}]
    (tmp_path / "alike").mkdir()
    got = _run_settings(tmp_path / "alike", alike)
    assert [g["said"] for g in got] == [None, None]
    assert len(got[0]["epochs"][0]) == len(got[1]["epochs"][0]) > 0


def test_ranks_reading_the_same_share_refuse_in_one_line(tmp_path, two_stores):
    """Three ranks whose loaders are given world_size=3 but rank=0, 0, 2 (LOCAL_RANK on a multi-node job, or one
    rank for all): group ranks 0 and 1 would read share 0 twice and share 1 never, silently (group rank 1's rank
    is not torch's, so it was never compared). Every rank raises the same one-line ConfigError naming who chose
    which share and the fix, and yields nothing."""
    settings = {"batch_size": 16, "seed": 7, "split": None, "world_size": 3}
    got = _run_settings(tmp_path, [{"store": two_stores, "settings": {**settings, "rank": share}, "epochs": [0]}
                                   for share in (0, 0, 2)])
    said = ("each rank must read its own share (PatchLoader rank= 0..2, each once), but group ranks 0-1 chose rank=0, "
            "so share 1 is read by no rank (missing from training while others are read twice); pass "
            "rank=torch.distributed.get_rank() (not LOCAL_RANK, which repeats on every node), or neither rank nor "
            "world_size to take torch.distributed's")
    assert got == [{"said": said, "epochs": []}] * 3


def test_ranks_reading_their_shares_in_another_order_yield_each_share(tmp_path, two_stores):
    """A launcher's own numbering, another permutation of the shares than torch's ranks (group rank r reads share
    (r + 1) % 3), is allowed: each rank yields, bit for bit, what a loader of that share yields outside any group."""
    import hashlib

    import hsgds

    settings = {"batch_size": 16, "seed": 7, "split": None, "world_size": 3}
    got = _run_settings(tmp_path, [{"store": two_stores, "settings": {**settings, "rank": (r + 1) % 3}, "epochs": [0]}
                                   for r in range(3)])
    for r in range(3):
        with hsgds.PatchLoader(two_stores, patch_size=5, device="cpu", return_coords=True,
                               **{**settings, "rank": (r + 1) % 3}) as alone:
            expected = [[c.tolist(), y.tolist(), hashlib.sha256(x.numpy().tobytes()).hexdigest()] for x, y, c in alone]
        assert got[r] == {"said": None, "epochs": [expected]}


RING_WORKER = textwrap.dedent("""
    import hashlib, json, os, sys
    import torch
    import torch.distributed as dist
    import hsgds

    rank, init, mode, work = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    share, ring_bytes, stores = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    loader = hsgds.PatchLoader(stores, patch_size=5, batch_size=16, split=None, device="cpu", return_coords=True,
                               seed=7, rank=share, world_size=2,
                               ring_bytes=ring_bytes)  # each rank its own ring (its GPU's free memory)
    start = 0
    if mode == "resume":  # every rank loads rank 0's state, as the README's training loop does
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True)
        loader.load_state_dict(state)
        start = state["epoch"]
    batches = []
    for epoch in range(start, 2):
        loader.set_epoch(epoch)
        for x, y, c in loader:
            dist.all_reduce(torch.ones(1))  # as DDP's gradient all-reduce: the ranks step together
            batches.append([epoch, c.tolist(), y.tolist(), hashlib.sha256(x.numpy().tobytes()).hexdigest()])
            if mode == "full" and rank == 0 and (epoch, loader.state_dict()["batch"]) == (0, 3):
                torch.save(loader.state_dict(), os.path.join(work, "state.pt"))  # a checkpoint mid-epoch
    loader.close()
    json.dump(batches, open(os.path.join(work, f"{mode}{rank}.json"), "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("shares", [(0, 1), (1, 0)], ids=["torch's ranks", "shares swapped"])
def test_rank_0s_state_resumes_ranks_whose_rings_differ(tmp_path, two_stores, shares):
    """Ranks' rings differ (each sized from its own GPU's free memory), and a rank's ring orders its share (the
    shuffle windows); a training script saves rank 0's state and loads it on every rank, which refused every rank
    whose ring was not rank 0's, though its own order, made with its own ring, would resume exactly. The gather as an
    iteration starts carries each rank's ring into the state: with rings of 6 and 5 tiles, both ranks loading rank
    0's state yield exactly the rest of their uninterrupted run (coordinates, labels, patch bytes). A rank whose ring
    changed since is refused in one line saying which ring_bytes resumes; a state without every rank's ring (an
    older hsgds's) is checked against its own ring, as before. The rings are saved by share (the rank a loader was
    given), which a launcher's own numbering may order otherwise than torch's ranks."""
    import torch

    import hsgds
    from hsgds.errors import ConfigError

    def alone(rank: int, tiles: int) -> hsgds.PatchLoader:
        return hsgds.PatchLoader(two_stores, patch_size=5, batch_size=16, split=None, device="cpu", return_coords=True,
                                 seed=7, rank=rank, world_size=2, ring_bytes=tiles * nbytes)

    with hsgds.PatchLoader(two_stores, patch_size=5, batch_size=16, split=None, device="cpu") as probe:
        nbytes = probe.stats.ring_bytes // probe.stats.slots  # one tile
    rings = [6, 5]  # share 0's, share 1's
    with alone(1, rings[1]) as own, alone(1, rings[0]) as other:  # the ring does order rank 1's share
        assert [c.tolist() for _, _, c in own] != [c.tolist() for _, _, c in other]
    script = tmp_path / "ring_worker.py"
    script.write_text(RING_WORKER)
    for mode in ("full", "resume"):
        _run_ranks([[sys.executable, str(script), str(r), f"file://{tmp_path / ('rv_' + mode)}", mode, str(tmp_path),
                     str(shares[r]), str(rings[shares[r]] * nbytes), *two_stores] for r in range(2)])
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # group rank 0's
    assert (state["epoch"], state["batch"], state["rank"], state["slots"]) == (0, 3, shares[0], rings[shares[0]])
    assert state["slots_by_rank"] == rings
    for r in range(2):
        full, resumed = (json.loads((tmp_path / f"{m}{r}.json").read_text()) for m in ("full", "resume"))
        assert len(full) > 3 and resumed == full[3:]
    with alone(1, rings[0]) as changed:  # rank 1 relaunched with rank 0's ring
        with pytest.raises(ConfigError, match=rf"^loader state was saved with a ring of 5 tiles for rank 1 but this "
                                              rf"loader has 6; pass ring_bytes={5 * nbytes} \(5 tiles of {nbytes} "
                                              r"bytes\) to resume the same order$"):
            changed.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "slots_by_rank"}  # checked against the saving rank's ring
    saved, other = state["slots"], 11 - state["slots"]
    with alone(1, saved) as like:
        like.load_state_dict(older)
    with alone(1, other) as unlike:
        with pytest.raises(ConfigError, match=rf"^loader state was saved with a ring of {saved} tiles but this loader "
                                              rf"has {other}; "):
            unlike.load_state_dict(older)


ALONE_WORKER = textwrap.dedent("""
    import datetime, os, sys, time
    import torch.distributed as dist
    import hsgds
    from hsgds.errors import HsgdsError

    store, rank, init, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=2))
    with hsgds.PatchLoader(store, patch_size=5, batch_size=32, split=None, device="cpu") as loader:  # sharded
        if rank == 0:  # e.g. a validation only rank 0 runs
            try:
                said = f"yielded {sum(len(y) for _, y in loader)} samples"
            except HsgdsError as e:
                said = str(e)
            open(out + ".tmp", "w").write(said)
            os.replace(out + ".tmp", out)
        else:  # alive, never iterating, until rank 0 is done (the group's timeout ends rank 0's wait)
            while not os.path.exists(out):
                time.sleep(0.1)
""")


def test_a_rank_iterating_a_sharded_loader_alone_is_told_so_at_the_groups_timeout(tmp_path, indian_pines_store):
    """A loader sharded over the group iterated on rank 0 only (a validation loop under `if rank == 0`) read half
    the split, silently; its settings comparison now waits for the other ranks, and the group's own timeout (2 s
    here) ends the wait with one line saying what went wrong and what to build instead, not torch's 'Timed out
    waiting 2000ms for send operation to complete'."""
    script = tmp_path / "alone_worker.py"
    script.write_text(ALONE_WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    out = tmp_path / "said.txt"
    _run_ranks([[sys.executable, str(script), str(indian_pines_store), str(r), init, str(out)] for r in range(2)])
    said = out.read_text()
    assert said.startswith("rank 0 could not compare this PatchLoader's settings with the other ranks' (") and "\n" not in said
    assert said.endswith("): every rank must iterate a loader sharded over the process group together (one that never "
                         "iterates it, or has failed, leaves the others waiting until the group's timeout); to read "
                         "a loader on some ranks only, build it with rank=0, world_size=1")


def test_readme_ddp_example_checkpoints_across_short_epochs_and_resumes(tmp_path, indian_pines_store):
    """The README's train_ddp.py, run as written by torchrun with 2 gloo ranks on two Indian Pines stores
    (17 batches per rank and epoch): it checkpointed at `step % 20 == 19` of each epoch, so with epochs shorter
    than 20 steps it never wrote one. Killed after a checkpoint inside an epoch and launched again, it resumes
    there: the checkpoint's step, raised by 1000 in between, ends at 1000 + every step of the 10 epochs only if
    the run went on from the saved step and loader position (a restart would end at the plain count)."""
    import os
    import re
    import shutil
    import time
    from pathlib import Path

    import torch

    import hsgds

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (tmp_path / "train_ddp.py").write_text(re.search(r"```python\n(# train_ddp\.py.*?)```", readme, re.S).group(1))
    for name in ("a.zarr", "b.zarr"):
        shutil.copytree(indian_pines_store, tmp_path / name)
    with hsgds.PatchLoader([tmp_path / "a.zarr", tmp_path / "b.zarr"], patch_size=13, batch_size=64, rank=0,
                           world_size=2) as loader:
        per_epoch = len(loader)
    assert per_epoch < 20  # the case the example missed
    ckpt = tmp_path / "ckpt.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train_ddp.py"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    # first launch: stopped (its whole process group) once a checkpoint inside an epoch is written
    run = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    saved = None
    try:
        while run.poll() is None and saved is None:
            if ckpt.exists():
                state = torch.load(ckpt, weights_only=True)
                if state["loader"]["batch"] != 0:
                    saved = state
            time.sleep(0.01)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        _, err = run.communicate(timeout=60)
    assert saved is not None, f"no checkpoint inside an epoch was written (exit {run.returncode}): {err[-2000:]}"
    assert saved["step"] == saved["loader"]["epoch"] * per_epoch + saved["loader"]["batch"]
    state = torch.load(ckpt, weights_only=True)  # (the last one written before the kill)
    state["step"] += 1000
    torch.save(state, ckpt)

    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    final = torch.load(ckpt, weights_only=True)
    assert (final["step"], final["loader"]["epoch"], final["loader"]["batch"]) == (1000 + 10 * per_epoch, 10, 0)
