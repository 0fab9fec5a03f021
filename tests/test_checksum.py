"""The wsum64 device checksum (hsgds.checksum) against an independent plain-Python implementation, on random
and adversarial tiles: single-bit flips at every position, swapped words, zeroed tails, truncated reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hsgds import checksum

M64 = 2**64


def reference(data: bytes) -> tuple[int, int]:
    """Written from the definition in docs/format.md, with Python integers (no wrapping to reason about)."""
    s = p = 0
    for i in range(0, len(data), 4):
        w = int.from_bytes(data[i:i + 4], "little")
        s += w
        p += (i // 4 + 1) * w
    return s % M64, p % M64


def reference_numpy(data: bytes) -> tuple[int, int]:
    """The same with numpy's wrapping uint64 arithmetic (fast enough for large tiles)."""
    w = np.frombuffer(data, dtype="<u4").astype(np.uint64)
    idx = np.arange(1, len(w) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(w.sum(dtype=np.uint64)), int((w * idx).sum(dtype=np.uint64))


def test_matches_the_reference_on_random_tiles():
    rng = np.random.default_rng(0)
    for nbytes in (4, 4096, 3 * 4096):
        for _ in range(3):
            data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
            assert checksum.checksum_of(data) == reference(data) == reference_numpy(data)


def test_wraps_like_uint64_on_large_tiles_and_across_chunks(monkeypatch):
    """All-ones words make both sums wrap; a small CHUNK_WORDS forces the chunked path."""
    data = b"\xff" * (4 << 20)  # 2**20 words of 2**32 - 1: P = (2**32 - 1) * 2**20 * (2**20 + 1) / 2 wraps
    want = reference_numpy(data)
    assert want[1] != (0xFFFFFFFF * (2**20) * (2**20 + 1) // 2)  # it did wrap
    assert checksum.checksum_of(data) == want
    monkeypatch.setattr(checksum, "CHUNK_WORDS", 1000)  # not a divisor of the word count
    assert checksum.checksum_of(data) == want
    rng = np.random.default_rng(1)
    tiles = torch.from_numpy(rng.integers(0, 256, (3, 8192), dtype=np.uint8))
    got = checksum.tile_checksums(tiles)
    for row, (s, p) in zip(tiles, got.tolist(), strict=True):  # one pair per tile, each checked
        assert (s % M64, p % M64) == reference(row.numpy().tobytes())


def test_every_single_bit_flip_is_detected():
    data = np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8)
    good = checksum.checksum_of(data.tobytes())
    flipped = np.repeat(data[None], 4096 * 8, axis=0)  # one copy per bit position
    pos = np.arange(4096 * 8)
    flipped[pos, pos // 8] ^= (1 << (pos % 8)).astype(np.uint8)
    got = checksum.tile_checksums(torch.from_numpy(flipped))
    assert got.shape == (4096 * 8, 2)  # a pair per flipped copy: missing rows would go unnoticed below
    expected = torch.from_numpy(checksum.as_signed([good]))
    assert not (got == expected).all(1).any(), "a flipped bit went unnoticed"


def test_swapped_words_zeroed_tail_and_truncated_read_are_detected():
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    good = checksum.checksum_of(data)
    words = np.frombuffer(data, dtype="<u4")
    for i, j in ((0, 1), (0, 1023), (17, 512), (1022, 1023)):
        assert words[i] != words[j]
        w = words.copy()
        w[[i, j]] = w[[j, i]]
        assert checksum.checksum_of(w.tobytes()) != good, (i, j)
        assert reference(w.tobytes()) != reference(data)
    for keep in (0, 1, 4, 2048, 4095):  # a read that stopped early into a zeroed buffer
        truncated = data[:keep] + bytes(4096 - keep)
        assert checksum.checksum_of(truncated) != good, keep
    # a tile of zeros has the zero checksum: a destination never written is not mistaken for data
    assert checksum.checksum_of(bytes(4096)) == (0, 0) != good


def test_encode_decode_and_input_checks():
    pair = (2**64 - 1, 12345)
    text = checksum.encode(pair)
    assert text == "ffffffffffffffff" + "0000000000003039" and checksum.decode(text) == pair
    for bad in ("", "g" * 32, "F" * 32, 12, "0" * 31):
        with pytest.raises(ValueError, match="not a wsum64 checksum"):
            checksum.decode(bad)
    with pytest.raises(ValueError, match="multiple of 4"):
        checksum.tile_checksums(torch.zeros((1, 6), dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        checksum.tile_checksums(torch.zeros((1, 8), dtype=torch.int16))


def test_adversarial_fills_odd_word_counts_and_swaps_at_power_of_two_distances(monkeypatch):
    """Against the plain-Python reference: all-zero and all-0xFF inputs of word counts that are not a multiple of
    2 (lengths of 4 mod 8 bytes), and two different words swapped at every distance 2**k, at the start, the middle
    and the end, across chunk boundaries (CHUNK_WORDS not a divisor of the word count)."""
    for nbytes in (4, 12, 20, 4100, 8 * 1001 + 4):
        for data in (bytes(nbytes), b"\xff" * nbytes):
            assert checksum.checksum_of(data) == reference(data), nbytes
    assert checksum.checksum_of(b"\xff" * 12) == (3 * 0xFFFFFFFF, 6 * 0xFFFFFFFF)  # by hand: S = 3w, P = (1+2+3)w
    monkeypatch.setattr(checksum, "CHUNK_WORDS", 1000)
    n = 1 << 16
    words = np.random.default_rng(4).integers(0, 2**32, n, dtype=np.uint64).astype("<u4")
    words[0], words[-1] = 0, 0xFFFFFFFF  # the extreme words take part in the swaps below
    good = checksum.checksum_of(words.tobytes())
    assert good == reference_numpy(words.tobytes())
    for k in range(16):
        for i in (0, n // 2 - (1 << k) // 2, n - 1 - (1 << k)):
            j = i + (1 << k)
            w = words.copy()
            w[[i, j]] = w[[j, i]]
            if words[i] != words[j]:
                assert checksum.checksum_of(w.tobytes()) != good, (k, i)
    w = words.copy()
    w[[0, -1]] = w[[-1, 0]]  # 0 and 2**32 - 1 at the two ends: P moves by (n - 1)(2**32 - 1)
    assert checksum.checksum_of(w.tobytes()) == reference_numpy(w.tobytes()) != good
