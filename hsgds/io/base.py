"""The reader interface and the description of the tiles it reads."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hsgds import checksum
from hsgds.errors import ChecksumError, TileReadError
from hsgds.format import (
    DAMAGED_OR_REPLACED,
    DEVICE_CHECKSUM_ALGORITHM,
    check_tile_crc,
    checksum_error,
    tile_size_error,
)


@dataclass(frozen=True)
class TileSource:
    """Where each tile lives and what it must look like: built from a Scene, shared by all readers.

    ``nbytes`` is every tile's size, or with ``sizes`` (tiles of several scenes that differ in band count
    or tile geometry) the largest, ``sizes`` giving each tile's own: see :meth:`tile_nbytes`.
    ``checksums`` are the tiles' crc32c; ``device_checksums`` their wsum64 pairs (unsigned (S, P), see
    :mod:`hsgds.checksum`), None for a format v1 store; ``store`` names the store in messages. ``local_ids``
    (tiles of several scenes): each tile's id in its own store, which messages name, as ``hsgds verify`` does.
    """

    paths: Sequence[Path]
    nbytes: int
    checksums: Sequence[int]
    sizes: tuple[int, ...] | None = None
    device_checksums: Sequence[tuple[int, int]] | None = None
    store: Path | None = None
    local_ids: Sequence[int] | None = None

    def tile_nbytes(self, tile_id: int) -> int:
        """The size of tile ``tile_id`` in bytes."""
        return self.nbytes if self.sizes is None else self.sizes[tile_id]

    def local_id(self, tile_id: int) -> int:
        """The id of tile ``tile_id`` in its own store (the id messages name)."""
        return tile_id if self.local_ids is None else int(self.local_ids[tile_id])

    @classmethod
    def from_scene(cls, scene: Any) -> TileSource:
        meta = scene.meta
        device = None if meta.device_checksums is None else tuple(checksum.decode(c) for c in meta.device_checksums)
        return cls(tuple(scene.tile_paths), scene.grid.tile_nbytes, tuple(meta.checksums), device_checksums=device,
                   store=scene.path)

    @classmethod
    def concat(cls, sources: list[TileSource]) -> TileSource:
        """One source over the tiles of several scenes: global tile id = the scene's first id + its tile id."""
        paths = tuple(p for s in sources for p in s.paths)
        checksums = tuple(c for s in sources for c in s.checksums)
        # device checksums only when every store has them; then a v1 store is the one to name in messages
        v1 = [s for s in sources if s.device_checksums is None]
        device = None if v1 else tuple(c for s in sources for c in s.device_checksums or ())
        store = v1[0].store if v1 else None
        local = tuple(s.local_id(i) for s in sources for i in range(len(s.paths)))
        if len({s.nbytes for s in sources}) == 1 and all(s.sizes is None for s in sources):
            return cls(paths, sources[0].nbytes, checksums, device_checksums=device, store=store, local_ids=local)
        sizes = tuple(s.tile_nbytes(i) for s in sources for i in range(len(s.paths)))
        return cls(paths, max(sizes), checksums, sizes, device_checksums=device, store=store, local_ids=local)

    @classmethod
    def deferred(cls, starts: Sequence[int], sizes: Sequence[int], scene: Callable[[int], TileSource],
                 device_checksums: bool) -> TileSource:
        """One source over the tiles of several scenes whose stores are opened only when first read:
        ``starts`` (S + 1) are the scenes' first global tile ids and the total, ``sizes`` every tile's size
        in bytes, ``scene(s)`` the source of scene ``s`` (it opens the store), asked for at most once
        per scene, when one of its tiles is first looked up. ``device_checksums``: every store has them."""
        per_scene = _PerScene(starts, scene)
        return cls(_Lazy(per_scene, "paths"), max(sizes), _Lazy(per_scene, "checksums"), tuple(sizes),
                   device_checksums=_Lazy(per_scene, "device_checksums") if device_checksums else None,
                   local_ids=_LocalIds(per_scene))

    def check_crc(self, tile_id: int, crc: int) -> None:
        check_tile_crc(self.local_id(tile_id), self.paths[tile_id], crc, self.checksums[tile_id], DAMAGED_OR_REPLACED)

    def device_checksum_error(self, tile_id: int) -> ChecksumError:
        return checksum_error(self.local_id(tile_id), self.paths[tile_id], DEVICE_CHECKSUM_ALGORITHM,
                              DAMAGED_OR_REPLACED)

    def size_error(self, tile_id: int, size: int) -> TileReadError:
        return tile_size_error(self.local_id(tile_id), self.paths[tile_id], size, self.tile_nbytes(tile_id),
                               DAMAGED_OR_REPLACED)


class ChunkReader(abc.ABC):
    """Reads whole tiles into preallocated buffers (ring slots). Thread-safe for distinct destinations.

    A reader describes itself: :attr:`name` (reported in loader stats), :attr:`batched` (whether one
    :meth:`read_many` call keeps its reads in flight together), :meth:`register` (prepare the ring's
    storage once). The registry in :mod:`hsgds.io` picks a reader by name.
    """

    #: short name reported in loader stats ("posix", "posix-direct", "posix-pinned", "kvikio-gds",
    #: "kvikio-compat")
    name: str = "reader"
    #: True when :meth:`read_many` overlaps its reads (kvikio: all issued, then all waited for). False
    #: when it reads one after another: the ring then spreads a batch over its threads instead.
    batched: bool = False

    def __init__(self, source: TileSource) -> None:
        self.source = source
        self.bytes_read = 0

    @abc.abstractmethod
    def read_into(self, tile_id: int, dest: Any) -> None:
        """Fill ``dest`` (a contiguous torch tensor of ``source.tile_nbytes(tile_id)`` bytes) with tile ``tile_id``.

        Raises TileReadError (missing / truncated / I/O error) or ChecksumError naming the tile; ``dest``
        is then in an undefined state and must not be used.
        """

    def read_many(self, requests: Iterable[tuple[int, Any]]) -> None:
        """Fill several destinations: ``requests`` are ``(tile_id, dest)`` pairs with distinct ``dest``.

        The default reads them one after another with :meth:`read_into` and stops at the first error,
        which it raises; the destinations not yet filled are then in an undefined state.
        """
        for tile_id, dest in requests:
            self.read_into(tile_id, dest)

    def register(self, storage: Any) -> None:
        """Prepare ``storage`` (the ring's tensor, every slot) for reads, once. The default does nothing;
        kvikio registers it with cuFile so GDS reads skip per-read pinning."""

    def close(self) -> None:
        """Release file handles and buffers. Idempotent."""

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PerScene:
    """The sources of several scenes, each made on first use (thread-safe: reader threads ask at once)."""

    def __init__(self, starts: Sequence[int], scene: Callable[[int], TileSource]) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self._scene = scene
        self._made: dict[int, TileSource] = {}
        self._lock = threading.Lock()

    def scene_of(self, tile_id: int) -> int:
        """The index of the scene holding global tile ``tile_id`` (its store is not opened)."""
        if not 0 <= tile_id < self.starts[-1]:
            raise IndexError(f"tile id {tile_id} out of range 0..{self.starts[-1] - 1}")
        return int(np.searchsorted(self.starts, tile_id, side="right")) - 1

    def locate(self, tile_id: int) -> tuple[TileSource, int]:
        """The source of the scene holding global tile ``tile_id``, and the tile's id in it."""
        s = self.scene_of(tile_id)
        with self._lock:
            source = self._made.get(s)
            if source is None:
                source = self._made[s] = self._scene(s)
        return source, tile_id - int(self.starts[s])


class _Lazy(Sequence):
    """One per-tile field (``paths``, ``checksums``, ``device_checksums``) of a :class:`_PerScene`."""

    def __init__(self, per_scene: _PerScene, field: str) -> None:
        self._per_scene, self._field = per_scene, field

    def __len__(self) -> int:
        return int(self._per_scene.starts[-1])

    def __getitem__(self, tile_id):  # type: ignore[override]
        if not isinstance(tile_id, (int, np.integer)):
            raise TypeError("deferred tile fields are looked up one tile at a time")
        source, local = self._per_scene.locate(int(tile_id))
        values = getattr(source, self._field)
        if values is None:
            raise TileReadError(f"tile {tile_id}: its store has no {self._field.replace('_', ' ')} "
                                "(format v1); convert it again")
        return values[local]


class _LocalIds(Sequence):
    """Each global tile's id in its own store, from the scenes' first ids alone (no store is opened)."""

    def __init__(self, per_scene: _PerScene) -> None:
        self._per_scene = per_scene

    def __len__(self) -> int:
        return int(self._per_scene.starts[-1])

    def __getitem__(self, tile_id):  # type: ignore[override]
        return int(tile_id) - int(self._per_scene.starts[self._per_scene.scene_of(int(tile_id))])
