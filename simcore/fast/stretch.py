"""Quiet stretches of the fast engine (simcore/fast/engine.py): runs of decode-only steps, planned at once.

When a policy's `schedule_decodes` answers a quiet step (simcore.batch.DecodeShortcut), every running request
decodes one token per step, and nothing else changes until the next arrival or think timer, the first
finish, or the first step whose KV growth would not fit. `plan_quiet_steps` finds those steps' end times,
durations and KV blocks in use, in the same float operations as one by one; the engine applies them.
"""
from __future__ import annotations

import numpy as np

# A stretch prices this many steps one by one before switching to vectorised chunks: most stretches are cut
# by an arrival or a finish within a few steps, and a numpy chunk has a fixed cost of tens of microseconds
# however few steps it prices, so chunks pay off only for the long stretches of a quiet period.
SCALAR_STEPS = 64
FIRST_CHUNK_STEPS, MAX_CHUNK_STEPS = 512, 4096   # a long stretch is usually cut within a few hundred steps


def plan_quiet_steps(price, rows: int, context_sum: int, step: int, block_size: int, growth_by_phase: list,
                     max_steps: int, used: int, num_blocks: int, first_seq: int, external: tuple[float, int],
                     ends: list, durs: list, useds: list) -> bool:
    """The first quiet steps of a stretch, one by one, appended to `ends` (end times; it holds the start),
    `durs` (durations) and `useds` (KV blocks in use during each). True when the stretch ends there, else
    `plan_more_quiet_steps` goes on from them.

    `price(context_sum)` prices one step: `rows` decodes whose contexts sum to `context_sum` in the first
    step (each step adds `rows`). The lazy decoders have taken `step` decode steps and grow by
    `growth_by_phase[(-step) % block_size]` blocks in the next one; `used` of `num_blocks` are in use now.
    The stretch ends at the first finish (`max_steps`), at the first step whose KV growth does not fit (left
    out: the policy preempts), or at the step whose end comes after the next external event `external`
    (time, seq; the first step's end event is `first_seq`)."""
    t_ext, e_ext = external
    free0 = num_blocks - used
    grown, j = 0, 0
    grows = any(growth_by_phase)
    t = ends[0]
    while j < SCALAR_STEPS:
        if grows:
            g = growth_by_phase[(-(step + j)) % block_size]
            if grown + g > free0:
                return True   # this step would preempt: the policy takes it from here
            grown += g
        d = price(context_sum)
        context_sum += rows
        t = t + d
        ends.append(t)
        durs.append(d)
        useds.append(used + grown)
        j += 1
        if t_ext < t or (t_ext == t and (j > 1 or e_ext < first_seq)) or j == max_steps:
            return True   # an external event comes before this step's end, or a finish
    return False


def plan_more_quiet_steps(price_many, rows: int, context_sum: int, step: int, block_size: int, growth_by_phase: list,
                          max_steps: int, used: int, num_blocks: int, external: tuple[float, int],
                          ends: list, durs: list, useds: list) -> None:
    """A long stretch goes on after `plan_quiet_steps`'s steps (`ends`, `durs`, `useds`, extended here; the
    other arguments as given to it) in chunks, each priced by one `price_many(context_sums)` call."""
    j0 = len(durs)
    t_ext = external[0]
    free0 = num_blocks - used
    used = useds[-1]
    chunk = FIRST_CHUNK_STEPS
    growth = np.array(growth_by_phase, dtype=np.int64) if any(growth_by_phase) else None
    grown0 = used - (num_blocks - free0)   # blocks grown by the stretch so far
    while j0 < max_steps:
        k = min(chunk, max_steps - j0)
        js = np.arange(j0, j0 + k)
        stop = j0 + k == max_steps
        used_after = np.full(k, used, dtype=np.int64)
        if growth is not None:
            cum = grown0 + np.cumsum(growth[(-(step + js)) % block_size])
            over = np.flatnonzero(cum > free0)
            if over.size:
                k, stop = int(over[0]), True
                js, cum = js[:k], cum[:k]
            used_after = (num_blocks - free0) + cum
        if k == 0:
            return
        d = np.asarray(price_many(context_sum + rows * js), dtype=float)
        e = np.add.accumulate(np.concatenate(([ends[-1]], d)))
        cut = int(np.searchsorted(e[1:], t_ext, side="left"))   # ties: the external comes first
        if cut < k:
            k, stop = cut + 1, True
        ends.extend(e[1:k + 1].tolist())
        durs.extend(d[:k].tolist())
        useds.extend(used_after[:k].tolist())
        if stop:
            return
        j0 += k
        used = useds[-1]
        grown0 = used - (num_blocks - free0)
        chunk = min(4 * chunk, MAX_CHUNK_STEPS)
