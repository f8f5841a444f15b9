"""SGLang's second prefill budget under hybrid sliding-window memory (simcore/sglang_swa.py): the sliding
pool's, beside the full pool's (sglang/srt/managers/schedule_policy.py `PrefillAdder`: `rem_swa_tokens`,
`_swa_budget_for_req`, `_update_prefill_budget`, `add_one_req`).

Each request a prefill batch admits is charged `max(its extend (cut to what is left of the chunk budget),
window) + page` sliding-pool tokens: the chunk it writes, at least a window for its decodes, and a page. A
request whose charge is not below the sliding pool's free tokens less what was charged is not admitted
(`NO_TOKEN`), and the batch stops once nothing is left. The full pool's budget is SGLang's usual one, against
the full pool's free tokens alone."""
from __future__ import annotations


class SwaBudget:
    """The sliding pool's side of one `PrefillAdder`. `full_free_blocks`: the full pool's free pages (what
    the usual budget counts against)."""

    def __init__(self, full_free_blocks: int, swa_free_blocks: int, window: int, page: int):
        self.full_free_blocks = full_free_blocks
        self.rem = swa_free_blocks * page
        self.window, self.page = window, page

    def need(self, extend: int, rem_chunk: int | None) -> int:
        """`_swa_budget_for_req`."""
        alloc = min(extend, rem_chunk) if rem_chunk is not None else extend
        return max(alloc, self.window) + self.page

    def fits(self, extend: int, rem_chunk: int | None) -> bool:
        return self.need(extend, rem_chunk) < self.rem

    def charge(self, extend: int, rem_chunk: int | None) -> None:
        self.rem -= self.need(extend, rem_chunk)

    @property
    def exhausted(self) -> bool:
        return self.rem <= 0


def swa_budget(view) -> SwaBudget | None:
    """The sliding pool's budget for a prefill step, where the engine runs SGLang's two pools; else None."""
    pool = view.hybrid_kv
    if pool is None or not hasattr(pool, "num_swa_free_blocks"):
        return None
    return SwaBudget(pool.num_full_free_blocks, pool.num_swa_free_blocks, pool.pools.sliding_window, view.block_size)
