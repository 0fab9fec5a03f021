"""The message ranks raise when their loaders' settings differ, and the payload they gather (the collective itself
runs in tests/test_distributed.py, over real gloo processes)."""

from __future__ import annotations

import torch

from hsgds.rank_settings import PAYLOAD_BYTES, SAME_SETTINGS, decoded, disagreement, encoded, gather_device, share_clash


def test_the_first_differing_setting_is_named_with_each_ranks_value():
    each = [{"seed": 0, "batch_size": 16}, {"seed": 1, "batch_size": 32}]
    assert disagreement(each, {}, {}) == f"ranks disagree on seed: rank 0 has 0, rank 1 has 1; {SAME_SETTINGS}"
    assert disagreement([{"seed": 0}] * 3, {}, {}) is None


def test_many_ranks_are_grouped_by_value_on_one_short_line():
    """64 ranks, each half-node of 8 with its own value: ranks are listed as runs, at most four values named, at
    most six runs of ranks for each (1,000 ranks alternating between two seeds)."""
    each = [{"epoch": 0, "seed": r // 4} for r in range(64)]
    said = disagreement(each, {"seed": "the seed"}, {"seed": "fix it"})
    assert said == ("ranks disagree on the seed: ranks 0-3 have 0, ranks 4-7 have 1, ranks 8-11 have 2, ranks 12-15 "
                    "have 3 and 12 other values; fix it")
    alternating = [{"seed": r % 2} for r in range(1000)]
    assert disagreement(alternating, {}, {}) == (f"ranks disagree on seed: ranks 0, 2, 4, 6, 8, 10 and 494 more have 0, "
                                                 f"ranks 1, 3, 5, 7, 9, 11 and 494 more have 1; {SAME_SETTINGS}")
    mixed = [{"drop_last": r % 3 == 0} for r in range(7)]
    assert disagreement(mixed, {}, {}) == (f"ranks disagree on drop_last: ranks 0, 3, 6 have True, ranks 1-2, 4-5 have "
                                           f"False; {SAME_SETTINGS}")


def test_a_setting_one_rank_lacks_and_values_of_another_type_differ():
    """A rank of another hsgds version may send other settings; 1 and True are not the same setting."""
    assert disagreement([{"a": 1}, {"a": 1, "b": 2}], {}, {}) == (
        f"ranks disagree on b: rank 0 has no such setting, rank 1 has 2; {SAME_SETTINGS}")
    assert disagreement([{"a": 1}, {"a": True}], {}, {}) == f"ranks disagree on a: rank 0 has 1, rank 1 has True; {SAME_SETTINGS}"


def test_the_payload_is_fixed_size_and_long_values_are_sent_as_digests():
    """Every rank sends PAYLOAD_BYTES whatever its settings (the gather needs equal sizes); a long value (an
    Augment's repr, many band indices) is compared by a digest that still tells two such values apart."""
    long_a, long_b = "x" * 500 + "a", "x" * 500 + "b"
    settings = {"seed": 2**64 - 1, "split": None, "shuffle": True, "augment": long_a, "bands": list(range(300))}
    payload = encoded(settings)
    assert len(payload) == PAYLOAD_BYTES == len(encoded({}))
    got = decoded(payload)
    assert got["seed"] == 2**64 - 1 and got["split"] is None and got["shuffle"] is True
    assert len(got["augment"]) < 120 and len(got["bands"]) < 120
    assert got["augment"] != decoded(encoded({"augment": long_b}))["augment"]


def test_the_gather_is_on_the_cpu_with_gloo_and_on_the_loaders_gpu_with_nccl():
    """NCCL gathers only CUDA tensors, each rank on its own GPU: the loader's (a rank that passed
    device=f"cuda:{local_rank}" without torch.cuda.set_device has current device 0, shared by every rank)."""
    cpu, gpu1 = torch.device("cpu"), torch.device("cuda", 1)
    for config in ("cpu:gloo,cuda:gloo", "cpu:gloo,cuda:nccl", "cpu:gloo", ""):
        assert gather_device(gpu1, config) == cpu and gather_device(cpu, config) == cpu
    assert gather_device(gpu1, "cuda:nccl") == gpu1


def test_shares_chosen_twice_are_named_by_group_rank_and_a_permutation_passes():
    """Two nodes of 8 given LOCAL_RANK as rank: group ranks r and r + 8 read share r, shares 8-15 none; the message
    names the first four shares chosen twice and stays one line. Any permutation of 0..W-1 is a share each."""
    said = share_clash([r % 8 for r in range(16)])
    assert said == ("each rank must read its own share (PatchLoader rank= 0..15, each once), but group ranks 0, 8 "
                    "chose rank=0, group ranks 1, 9 chose rank=1, group ranks 2, 10 chose rank=2, group ranks 3, 11 "
                    "chose rank=3 and 4 other shares were chosen by several, so shares 8-15 are read by no rank "
                    "(missing from training while others are read twice); pass rank=torch.distributed.get_rank() "
                    "(not LOCAL_RANK, which repeats on every node), or neither rank nor world_size to take "
                    "torch.distributed's")
    assert share_clash([0, 1, 2]) is None and share_clash([2, 0, 1]) is None
    assert share_clash(list(range(999, -1, -1))) is None
