"""`FreeList`: first-fit carving of one memory range into aligned pieces.

Shared by the shm pool (sealed memfd segments) and the cuda-ipc pool (device slabs).
"""

from __future__ import annotations


class FreeList:
    """The free ranges of a block of `size` bytes, sorted by offset and merged."""

    def __init__(self, size: int) -> None:
        self.free: list[tuple[int, int]] = [(0, size)]

    def carve(self, n: int, align: int) -> int | None:
        """The offset of `n` free bytes aligned to `align` (first fit), now taken."""
        for i, (off, size) in enumerate(self.free):
            start = -(-off // align) * align
            if start + n <= off + size:
                rest: list[tuple[int, int]] = []
                if start > off:
                    rest.append((off, start - off))
                if start + n < off + size:
                    rest.append((start + n, off + size - start - n))
                self.free[i : i + 1] = rest
                return start
        return None

    def give_back(self, off: int, n: int) -> None:
        """Returns `off..off+n` to the free list, merging neighbours."""
        free = self.free
        lo, hi = 0, len(free)
        while lo < hi:
            mid = (lo + hi) // 2
            if free[mid][0] < off:
                lo = mid + 1
            else:
                hi = mid
        free.insert(lo, (off, n))
        if lo + 1 < len(free) and free[lo][0] + free[lo][1] == free[lo + 1][0]:
            free[lo] = (free[lo][0], free[lo][1] + free[lo + 1][1])
            del free[lo + 1]
        if lo > 0 and free[lo - 1][0] + free[lo - 1][1] == free[lo][0]:
            free[lo - 1] = (free[lo - 1][0], free[lo - 1][1] + free[lo][1])
            del free[lo]
