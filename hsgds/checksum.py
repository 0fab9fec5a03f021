"""The device checksum of a tile, ``wsum64``: one implementation in torch ops that runs on CPU tensors (the
converter, ``hsgds verify``, CI) and on CUDA tensors (the kvikio reader, right after each read).

crc32c is sequential per byte and has no cheap device kernel in torch, so format v2 stores a second checksum
per tile that a few whole-tensor reductions compute. A tile's bytes are read as n little-endian unsigned 32-bit
words w_0 .. w_{n-1} (every tile is a multiple of 4096 bytes) and the checksum is the pair

    S = sum(w_i)                 mod 2**64
    P = sum((i + 1) * w_i)       mod 2**64

What it detects, for a tile of at most 2**29 words (the 2 GiB tile limit): every change of a single word (so
every flipped bit, and any burst within 4 aligned bytes), because S changes by a nonzero amount below 2**61;
any zeroed or short-read tail with a nonzero byte in it (S is an exact, non-wrapping sum); any two different
words swapped, because P changes by (j - i)(w_i - w_j), nonzero and below 2**61. What it does
not: changes to two or more words that cancel in both sums (e.g. +d on one word, -d on another, at positions
whose weighted difference is a multiple of 2**64) -- not a cryptographic hash, and not as strong as crc32c
against random multi-word damage (a random change goes unnoticed with probability about 2**-64 for P alone).
crc32c stays in the store and is checked on the host (POSIX reader, ``hsgds verify``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

#: its name in store metadata (hsgds.format.DEVICE_CHECKSUM_ALGORITHM is this constant)
ALGORITHM = "wsum64"
#: words per tile reduced in one step: bounds the int64 temporaries to a few times 8 * k * this bytes
CHUNK_WORDS = 1 << 20
_MASK32 = 0xFFFFFFFF


def tile_checksums(tiles: Any) -> Any:
    """The ``wsum64`` pair of each tile: ``tiles`` is a (k, nbytes) uint8 torch tensor (CPU or CUDA, rows
    contiguous, nbytes a multiple of 4); returns a (k, 2) int64 tensor on the same device holding (S, P)
    as the two's-complement bit patterns of the unsigned 64-bit values.

    The additions wrap modulo 2**64 (two's-complement int64, on the CPU and the GPU alike); each product
    (i + 1) * w_i is below 2**61 and exact.
    """
    import torch

    if tiles.dtype != torch.uint8 or tiles.dim() != 2 or tiles.shape[1] % 4:
        raise ValueError(f"expected a (k, nbytes) uint8 tensor with nbytes a multiple of 4, got "
                         f"{tuple(tiles.shape)} {tiles.dtype}")
    import sys

    if sys.byteorder != "little":  # the words are read in the machine's order below
        raise NotImplementedError("the wsum64 checksum is implemented for little-endian machines only")
    words = tiles.contiguous().view(torch.int32)  # (k, n): the same bytes as signed 32-bit words
    k, n = words.shape
    out = torch.zeros((k, 2), dtype=torch.int64, device=tiles.device)
    for a in range(0, n, CHUNK_WORDS):
        b = min(n, a + CHUNK_WORDS)
        w = words[:, a:b].to(torch.int64) & _MASK32  # the unsigned word values
        weights = torch.arange(a + 1, b + 1, dtype=torch.int64, device=tiles.device)
        out[:, 0] += w.sum(1)
        out[:, 1] += (w * weights).sum(1)
    return out


def checksum_of(data: Any) -> tuple[int, int]:
    """The ``wsum64`` pair (S, P) of one tile's bytes (bytes-like or a numpy array), as unsigned ints,
    computed with :func:`tile_checksums` on the CPU."""
    import torch

    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    with warnings.catch_warnings():  # read-only buffers: torch warns that it cannot protect writes; none happen
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(arr)
    s, p = tile_checksums(tensor[None])[0].tolist()
    return s & (2**64 - 1), p & (2**64 - 1)


def encode(pair: tuple[int, int]) -> str:
    """The store's text form of a pair: 32 lowercase hex digits, S then P (JSON numbers lose 64-bit precision
    in many parsers)."""
    s, p = pair
    return f"{s & (2**64 - 1):016x}{p & (2**64 - 1):016x}"


def decode(text: str) -> tuple[int, int]:
    """The unsigned (S, P) of :func:`encode`'s text; ValueError when it is not 32 hex digits."""
    if not isinstance(text, str) or len(text) != 32 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"not a {ALGORITHM} checksum: {str(text)[:40]!r}")
    return int(text[:16], 16), int(text[16:], 16)


def as_signed(pairs: list[tuple[int, int]]) -> np.ndarray:
    """Unsigned pairs as the (k, 2) int64 bit patterns :func:`tile_checksums` returns."""
    return np.asarray(pairs, dtype=np.uint64).reshape(-1, 2).view(np.int64)
