"""A CPU loader hands out batches from a pool of reusable buffers (the torch engine's output pool): a
batch the caller still references in any form the pool can see is never rewritten by a later batch. Each
test keeps only one kind of reference to the first batch, drops the batch itself, runs more batches than
the pool holds, and compares what the reference reads with a copy taken when the batch was yielded."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import hsgds
from hsgds import defaults


@pytest.fixture(scope="module")
def store(synthetic_store):
    return synthetic_store(40, 36, 8, classes=4, dtype="uint16", seed=5, labelled_fraction=1.0, tile=10,
                           max_patch=7)[0]


def _storage_tensor(storage, dtype, offset, numel):
    """The ``numel`` values at ``offset`` of a storage handle (untyped, or the deprecated typed one)."""
    untyped = storage._untyped_storage if isinstance(storage, torch.TypedStorage) else storage
    return torch.empty(0, dtype=dtype).set_(untyped, offset, (numel,), (1,))


def _typed_storage(batch):
    with warnings.catch_warnings():  # TypedStorage is deprecated, but a caller may still hold one
        warnings.simplefilter("ignore", UserWarning)
        return batch.storage()


# kind: (keep a reference made from the batch, read the batch's values back through that reference alone)
HOLDS = {
    "untyped_storage": (lambda b: b.untyped_storage(),
                        lambda s, dt, off, n: _storage_tensor(s, dt, off, n)),
    "untyped_storage_in_a_list": (lambda b: [b.untyped_storage()],
                                  lambda s, dt, off, n: _storage_tensor(s[0], dt, off, n)),
    "typed_storage": (_typed_storage, lambda s, dt, off, n: _storage_tensor(s, dt, off, n)),
    "numpy": (lambda b: b.numpy(), lambda a, dt, off, n: torch.from_numpy(a).reshape(-1)),
    "from_numpy_of_numpy": (lambda b: torch.from_numpy(b.numpy()), lambda t, dt, off, n: t.reshape(-1)),
    "memoryview_of_numpy": (lambda b: memoryview(b.numpy()),
                            lambda m, dt, off, n: torch.from_numpy(np.asarray(m)).reshape(-1)),
    "frombuffer_of_numpy": (lambda b: torch.frombuffer(b.numpy(), dtype=b.dtype), lambda t, dt, off, n: t),
    "tensor_set_on_its_storage": (lambda b: torch.empty(0, dtype=b.dtype).set_(b.untyped_storage()),
                                  lambda t, dt, off, n: t[off:off + n]),
    "dlpack_capsule": (lambda b: torch.utils.dlpack.to_dlpack(b),
                       lambda c, dt, off, n: torch.utils.dlpack.from_dlpack(c).reshape(-1)),
    "numpy_from_dlpack": (lambda b: np.from_dlpack(b), lambda a, dt, off, n: torch.from_numpy(a).reshape(-1)),
}


@pytest.mark.parametrize("cut_ahead", [True, False])
@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_a_batch_held_only_through_one_reference_is_never_rewritten(store, hold, cut_ahead):
    keep, read = HOLDS[hold]
    with defaults.set(cut_ahead=cut_ahead):
        loader = hsgds.PatchLoader(store, patch_size=5, batch_size=16, split=None, device="cpu", seed=2)
    with loader:
        it = iter(loader)
        batch, _ = next(it)
        dtype, offset, numel = batch.dtype, batch.storage_offset(), batch.numel()
        expected = batch.clone().reshape(-1)
        kept = keep(batch)
        del batch
        later = 0
        for later, (other, _) in enumerate(it, 1):  # more batches than the pool holds, each dropped
            del other
            if later == 10:
                break
        assert later == 10
        assert torch.equal(read(kept, dtype, offset, numel), expected)


def _hold_in_another_process(inbox, outbox):
    """Receive a batch through a torch.multiprocessing queue (its shared memory mapped here), say so,
    and once told that the sender cut more batches, send back a copy of what it reads now."""
    batch = inbox.get()
    outbox.put("received")
    inbox.get()
    outbox.put(batch.clone().numpy())


def test_a_batch_sent_to_another_process_is_never_rewritten(store):
    """A torch.multiprocessing queue moves the batch's buffer into shared memory that the receiving process
    maps; the sender keeps no reference once it is sent, so the pool must never reuse that buffer."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_hold_in_another_process, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        with hsgds.PatchLoader(store, patch_size=5, batch_size=16, split=None, device="cpu", seed=2) as loader:
            it = iter(loader)
            batch, _ = next(it)
            expected = batch.clone().numpy()
            inbox.put(batch)
            del batch
            assert outbox.get(timeout=120) == "received"
            for later, (other, _) in enumerate(it, 1):
                del other
                if later == 10:
                    break
            inbox.put("look again")
            seen = outbox.get(timeout=120)
        np.testing.assert_array_equal(seen, expected)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
