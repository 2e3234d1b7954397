"""A paged KV cache with prefix caching by block hashes, as vLLM's block pool keeps it.

Full blocks of a prompt are named by a hash chained over their tokens; a block whose hash is
cached is shared (in use) or reclaimed (cached but unused) instead of recomputed. Cached
blocks nobody uses count as free, and are evicted least-recently-used when space is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import repeat
from operator import countOf


def block_hashes(tokens: Sequence[int], block_size: int, known: Sequence[int] = ()) -> list[int]:
    """Chained hashes of the full blocks of `tokens`: equal prefixes give equal hashes.
    `known`: the hashes of its first blocks where the caller has them (a prefix it sent
    before), taken as they are and not computed again."""
    hashes = list(known)
    previous = hashes[-1] if hashes else 0
    # A tuple's slice is a tuple: one allocation per block, not two.
    rest = tuple(tokens[len(hashes) * block_size :])
    for start in range(0, len(rest) - block_size + 1, block_size):
        previous = hash((previous, rest[start : start + block_size]))
        hashes.append(previous)
    return hashes


class KvCache:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        # Without prefix caching the engine names no blocks: every block is private.
        if num_blocks < 2:
            raise ValueError("a KV cache needs at least 2 blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.usable = num_blocks - 1  # vLLM keeps one null block aside
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._in_use = 0  # blocks referenced by at least one request

    @property
    def free(self) -> int:
        """Blocks a request could get now (cached blocks nobody uses included)."""
        return self.usable - self._in_use

    @property
    def evictable(self) -> int:
        """Cached blocks no request uses (counted as free; reclaimed when space is needed)."""
        return len(self._evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.free / self.usable

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are cached (in use or evictable)."""
        if not self.prefix_caching:
            return 0
        count = 0
        for block in hashes:
            if block not in self._refs:
                break
            count += 1
        return count

    def cost(self, hashes: Sequence[int], private: int) -> int:
        """Free blocks needed to hold `hashes` (shared where in use) plus `private` new ones."""
        # Blocks not held by a request (uncached, or cached but unused) need a free one each;
        # counted in C: a long prompt's list is thousands of blocks, asked each step it waits.
        return countOf(map(self._refs.get, hashes, repeat(0)), 0) + private

    def acquire(self, hashes: Sequence[int], private: int) -> None:
        """Take references on `hashes` and `private` unnamed blocks; call cost() first."""
        if self.cost(hashes, private) > self.free:
            raise MemoryError("not enough free KV blocks")
        for block in hashes:
            refs = self._refs.get(block, 0)
            if refs == 0:
                if block in self._evictable:
                    del self._evictable[block]
                else:
                    self._make_room()
                self._in_use += 1
            self._refs[block] = refs + 1
        self._take(private)

    def allocate(self, count: int) -> None:
        """Take `count` fresh unnamed blocks (vllm/v1/core/block_pool.py get_new_blocks: from
        the free queue's front: empty space first, then the least recently freed cached
        block); call cost() first."""
        if count > self.free:
            raise MemoryError("not enough free KV blocks")
        self._take(count)

    def _take(self, count: int) -> None:
        # `count` unnamed blocks at once (a fast-forwarded stretch takes hundreds): what
        # `count` calls of _make_room take, empty space first, then the least recently used
        # cached blocks, without a call per block.
        empty = max(self.usable - self._in_use - len(self._evictable), 0)
        for _ in range(min(count - empty, len(self._evictable))):
            oldest, _ = self._evictable.popitem(last=False)
            del self._refs[oldest]
        self._in_use += count

    def name_blocks(
        self, blocks: list[int | None], hashes: Sequence[int], start: int, end: int
    ) -> None:
        """The held blocks blocks[start:end], just filled with computed tokens, get their
        hashes from `hashes` (vLLM's cache_full_blocks), written into `blocks`; a block stays
        unnamed (None) where caching is off or another block already holds its hash. One call
        for a request's whole run of newly full blocks."""
        if not self.prefix_caching:
            return
        refs = self._refs
        for index in range(start, end):
            block = hashes[index]
            if blocks[index] is None and block not in refs:
                refs[block] = 1
                blocks[index] = block

    def release(self, hashes: Sequence[int], private: int) -> None:
        """Drop references to a request's blocks, `hashes` first and then `private` unnamed
        ones, freed in reverse order as vLLM frees them (single_type_kv_cache_manager.py
        free): unnamed blocks become empty space, named ones stay cached (evictable), the
        tail's before the head's, so a sequence's tail is evicted first."""
        self.release_blocks([*hashes, *([None] * private)])

    def release_blocks(self, blocks: Sequence[int | None]) -> None:
        """Free a request's blocks (a hash, or None for an unnamed one) in reverse order."""
        refs, evictable = self._refs, self._evictable
        freed = 0
        for block in reversed(blocks):
            if block is None:
                freed += 1
                continue
            left = refs[block] - 1
            refs[block] = left
            if not left:
                freed += 1
                evictable[block] = None
        self._in_use -= freed

    def _make_room(self) -> None:
        # A fresh block comes from empty space first, else from the least recently used
        # cached block that no request holds.
        empty = self.usable - self._in_use - len(self._evictable)
        if empty <= 0 and self._evictable:
            oldest, _ = self._evictable.popitem(last=False)
            del self._refs[oldest]


class HostCache:
    """vLLM's native CPU offload tier (--kv-offloading-size): named blocks stored to host
    memory as they are computed, kept least-recently-used up to `num_blocks`; a prefix the
    device evicted is loaded back from here."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a CPU offload tier needs at least one block")
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @property
    def usage(self) -> float:
        """vllm:kv_offload_cpu_cache_usage_perc: the share of the tier's blocks in use."""
        return len(self._blocks) / self.num_blocks

    def cached_run(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` the tier holds."""
        count = 0
        for block in hashes:
            if block not in self._blocks:
                break
            count += 1
        return count

    def touch(self, hashes: Sequence[int]) -> None:
        for block in hashes:
            self._blocks.move_to_end(block)

    def store(self, hashes: Sequence[int]) -> int:
        """Store the blocks the tier lacks (evicting the least recently used); return how
        many were stored."""
        stored = 0
        for block in hashes:
            if block in self._blocks:
                self._blocks.move_to_end(block)
                continue
            if len(self._blocks) >= self.num_blocks:
                self._blocks.popitem(last=False)
            self._blocks[block] = None
            stored += 1
        return stored
