"""`Recent`: the open sessions of `synthesize` in the order they were last used, as a list of
short blocks, so that taking the ``k``-th, moving it to the end and dropping the oldest cost
O(sqrt n) instead of a list's O(n) (at a fleet's 60,000 open sessions a plain list's shifts
dominated the generator)."""

from __future__ import annotations

BLOCK = 4096  # a block is split in two when it reaches twice this length (a pop's shift of
# at most 8,192 references costs about what walking a few blocks does)


class Recent:
    """A sequence of ints with ``len``, ``[k]``, ``pop(k)``, ``locate(k)`` / ``drop``, ``append``
    and ``popleft``;
    the same order as a list doing the same operations."""

    __slots__ = ("blocks", "n")

    def __init__(self) -> None:
        self.blocks: list[list[int]] = [[]]
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def _find(self, k: int) -> tuple[int, int]:
        """(block, offset) of item ``k`` (``0 <= k < n``)."""
        blocks = self.blocks
        if k >= self.n >> 1:  # walk from the end
            k = self.n - k  # items from the end, >= 1
            b = len(blocks) - 1
            for blk in reversed(blocks):
                size = len(blk)
                if k <= size:
                    return b, size - k
                k -= size
                b -= 1
        for b, blk in enumerate(blocks):
            size = len(blk)
            if k < size:
                return b, k
            k -= size
        raise IndexError(k)

    def __getitem__(self, k: int) -> int:
        b, i = self._find(k)
        return self.blocks[b][i]

    def pop(self, k: int) -> int:
        """Remove and return item ``k``."""
        return self._remove(*self._find(k))

    def locate(self, k: int) -> tuple[int, tuple[int, int]]:
        """Item ``k`` and where it is (for `drop`, before any other change)."""
        b, i = self._find(k)
        return self.blocks[b][i], (b, i)

    def drop(self, where: tuple[int, int], *, to_end: bool) -> None:
        """Remove the item `locate` found; put it back at the end when ``to_end``."""
        b, i = where
        if to_end and b == len(self.blocks) - 1 and i == len(self.blocks[b]) - 1:
            return  # already the last
        v = self._remove(b, i)
        if to_end:
            self.append(v)

    def _remove(self, b: int, i: int) -> int:
        block = self.blocks[b]
        v = block.pop(i)
        self.n -= 1
        if not block and len(self.blocks) > 1:
            del self.blocks[b]
        elif len(self.blocks) > 4 + 2 * self.n // BLOCK:  # removals thinned the blocks out
            flat = [x for blk in self.blocks for x in blk]
            self.blocks = [flat[j : j + BLOCK] for j in range(0, len(flat), BLOCK)] or [[]]
        return v

    def append(self, v: int) -> None:
        last = self.blocks[-1]
        last.append(v)
        self.n += 1
        if len(last) >= 2 * BLOCK:
            self.blocks[-1:] = [last[:BLOCK], last[BLOCK:]]

    def popleft(self) -> int:
        return self.pop(0)
