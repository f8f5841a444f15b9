"""numpy's `a.sum()` of a float64 column, bit for bit, from the column handed over in consecutive chunks:
what lets a streamed run's summary keep time-weighted means identical without holding the iteration rows.

numpy sums a contiguous float64 array by pairwise summation (numpy/_core/src/umath/loops_utils.h.src,
`pairwise_sum`): n <= 128 elements are added in 8 interleaved accumulators, combined as
((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the n % 8 left over one by one (fewer than 8: one by
one from 0.0); a longer array splits at n2 = n / 2 rounded down to a multiple of 8, and the halves' sums
are added. The split points depend only on n, so once n is known the leaves can be summed as their rows
stream past (vectorised across leaves of one length: the same additions elementwise) and the tree
combined from the leaf sums. tests/test_stream_tables.py checks it against `np.sum`.
"""
from __future__ import annotations

import numpy as np

BLOCK = 128   # numpy's PW_BLOCKSIZE


def leaf_sizes(n: int) -> list[int]:
    """The lengths of the leaves of numpy's summation tree over n elements, in order."""
    if n <= BLOCK:
        return [n]
    n2 = n // 2
    n2 -= n2 % 8
    return leaf_sizes(n2) + leaf_sizes(n - n2)


def _leaf_sums(block: np.ndarray) -> np.ndarray:
    """Sums of the rows of `block` (leaves, m elements, columns), each as numpy sums an m-element leaf."""
    m = block.shape[1]
    if m < 8:
        res = np.zeros((block.shape[0], block.shape[2]))
        for i in range(m):
            res += block[:, i]
        return res
    r = block[:, :8].copy()
    for i in range(8, m - m % 8, 8):
        r += block[:, i:i + 8]
    res = ((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
    for i in range(m - m % 8, m):
        res += block[:, i]
    return res


def _combine(n: int, leaves) -> list[float]:
    """The tree's sum from its leaf sums (an iterator of per-column lists, in order)."""
    if n <= BLOCK:
        return next(leaves)
    n2 = n // 2
    n2 -= n2 % 8
    a, b = _combine(n2, leaves), _combine(n - n2, leaves)
    return [x + y for x, y in zip(a, b)]


def column_sums(chunks, n: int, num_columns: int) -> list[float]:
    """`[col.sum() for col in columns]` for n rows of `num_columns` float64 columns handed over as
    consecutive (rows, num_columns) chunks; holds one chunk (plus a partial leaf) and one sum per leaf."""
    sizes = np.array(leaf_sizes(n) if n else [], dtype=np.int64)
    ends = np.cumsum(sizes)
    sums = np.zeros((len(sizes), num_columns))
    buf, start, first_leaf = np.zeros((0, num_columns)), 0, 0   # buf holds rows from `start` on
    for chunk in chunks:
        buf = np.concatenate((buf, np.asarray(chunk, dtype=float).reshape(-1, num_columns)))
        last_leaf = int(np.searchsorted(ends, start + len(buf), side="right"))   # leaves now complete
        offsets = ends[first_leaf:last_leaf] - sizes[first_leaf:last_leaf] - start
        for m in np.unique(sizes[first_leaf:last_leaf]).tolist():
            pick = np.flatnonzero(sizes[first_leaf:last_leaf] == m)
            rows = offsets[pick][:, None] + np.arange(m)
            sums[first_leaf + pick] = _leaf_sums(buf[rows])
        done = int(ends[last_leaf - 1]) - start if last_leaf > first_leaf else 0
        buf, start, first_leaf = buf[done:], start + done, last_leaf
    if first_leaf != len(sizes) or len(buf):
        raise ValueError(f"column_sums: expected {n} rows, got {start + len(buf)}")
    if not n:
        return [0.0] * num_columns
    return _combine(n, iter(sums.tolist()))


class StreamedSum:
    """`column_sums` for one column handed over chunk by chunk (`add`), as they come, then `total()`: for
    several sums over different row subsets read in one pass over the same chunks."""

    def __init__(self, n: int):
        self.n = n
        self.sizes = np.array(leaf_sizes(n) if n else [], dtype=np.int64)
        self.ends = np.cumsum(self.sizes)
        self.sums = np.zeros((len(self.sizes), 1))
        self.buf, self.start, self.first_leaf = np.zeros((0, 1)), 0, 0   # buf holds rows from `start` on

    def add(self, chunk: np.ndarray) -> None:
        if not len(chunk):
            return
        sizes, ends, first_leaf = self.sizes, self.ends, self.first_leaf
        buf = np.concatenate((self.buf, np.asarray(chunk, dtype=float).reshape(-1, 1)))
        last_leaf = int(np.searchsorted(ends, self.start + len(buf), side="right"))   # leaves now complete
        offsets = ends[first_leaf:last_leaf] - sizes[first_leaf:last_leaf] - self.start
        for m in np.unique(sizes[first_leaf:last_leaf]).tolist():
            pick = np.flatnonzero(sizes[first_leaf:last_leaf] == m)
            rows = offsets[pick][:, None] + np.arange(m)
            self.sums[first_leaf + pick] = _leaf_sums(buf[rows])
        done = int(ends[last_leaf - 1]) - self.start if last_leaf > first_leaf else 0
        self.buf, self.start, self.first_leaf = buf[done:], self.start + done, last_leaf

    def total(self) -> float:
        if self.first_leaf != len(self.sizes) or len(self.buf):
            raise ValueError(f"StreamedSum: expected {self.n} rows, got {self.start + len(self.buf)}")
        return _combine(self.n, iter(self.sums.tolist()))[0] if self.n else 0.0
