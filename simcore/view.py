"""The read-only view of an engine that a policy decides from: the scheduling-state protocol both engines
implement (simcore/engine.py over its request records, simcore/fast/engine.py over the same records with
lazily advanced decoders)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence

from simcore.batch import Batch
from simcore.kvcache import cdiv
from simcore.request import Request, RequestSpec, Status

SWAPPED = Status.SWAPPED


class LazyProgress(Protocol):
    """The progress of running requests that an engine advances lazily (the fast engine's lazy decoders,
    simcore/fast/decoders.py): their progress fields are stale, the truth is asked here."""
    step: int                    # decode steps the lazy decoders have taken
    block_size: int
    growth_by_phase: list[int]   # blocks they take at their next step: growth_by_phase[(-step) % block_size]

    def num_generated_tokens(self, req: Request) -> int:
        """Tokens `req` has generated so far."""
        ...


@dataclass(slots=True)
class EngineView:
    """A snapshot an engine hands its policy each iteration. Policies must not mutate what it holds (they
    report each decision to `take`, which only updates the view's own prefix-cache scratch plan). Not a
    frozen dataclass only because engines build one per decision, and a frozen dataclass sets each field
    through object.__setattr__, several times slower than a plain one.

    `waiting`: FCFS order, front first (new arrivals, recompute-preempted and swapped requests).
    `running`: admission order (a resumed request is appended again at the end, as in vLLM).
    `draining`: finished requests whose slot and KV are still held (static batching only).
    `policy_state`: what the policy returned as `Batch.policy_state` last time (None at the start).
    `decoders`: the fast engine's lazy decoders (a `LazyProgress`), when running requests may be lazy
    decoders whose progress fields are stale (only in a `Policy.schedule_decodes` call, where every running
    request decodes); read their progress through `num_generated_tokens` and `num_decode_growth_blocks`,
    which answer in O(1) there. None: every field is current.
    """
    now_s: float
    waiting: Sequence[Request]
    running: Sequence[Request]
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    max_model_len: int
    draining: Sequence[Request] = ()
    policy_state: object = None
    prefix_cache: object | None = None  # the engine's PrefixCachingBlockPool when prefix caching is on
    decoders: LazyProgress | None = None
    num_lookahead_tokens: int = 0   # speculative decoding: KV slots held past each scheduled row (vLLM's)
    num_speculative_tokens: int = 0  # speculative decoding: k drafts a decoding request carries
    num_draft_slots: int = 0         # speculative decoding: input slots a draft model takes per request (vLLM)
    hybrid_kv: object | None = None  # the engine's simcore.hybridkv.HybridBlockPool under vLLM's hybrid manager
    _step_plan: object = field(default=None, repr=False, compare=False)

    def _plan(self):
        """The step's prefix-cache plan (simcore.kvcache.StepPlan), made on first use; None without caching."""
        plan = self._step_plan
        if plan is None and self.prefix_cache is not None:
            plan = self._step_plan = self.prefix_cache.plan()
        return plan

    def _is_new(self, req: Request) -> bool:
        return req.num_computed_tokens == 0 and req.status is Status.WAITING

    def num_cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens a prefix-cache hit lets `req` skip when admitted now, after what the policy took
        earlier in this step: full cached blocks, at most num_tokens - 1. Nonzero only with prefix caching
        on, for a new or recompute-preempted request."""
        if self.prefix_cache is None or not self._is_new(req):
            return 0
        return len(self._plan().hit_blocks(req)) * self.block_size

    def blocks_to_hold(self, req: Request, num_tokens: int) -> int:
        """Free GPU blocks `req` takes to hold KV for `num_tokens` tokens: the growth beyond what it holds,
        plus, for a swapped request, the blocks it brings back from the host. With prefix caching, a new
        request's hit blocks that other requests hold (or take this step) are shared and take no free block.
        Under vLLM's hybrid manager the pool answers, net of the out-of-window blocks freed first."""
        if self.hybrid_kv is not None:   # (with prefix caching, on the step's plan)
            return (self._plan() or self.hybrid_kv).blocks_to_hold(req, num_tokens)
        if self.prefix_cache is not None and self._is_new(req):
            return cdiv(num_tokens, self.block_size) - self._plan().num_held_hit_blocks(req)
        held = req.num_blocks
        extra = -(-num_tokens // self.block_size) - held
        if extra < 0:   # (not max(0, ...): policies ask this once per request they consider, on the fast path too)
            extra = 0
        return extra + held if req.status is SWAPPED else extra

    def blocks_to_allocate(self, req: Request, num_tokens: int) -> int:
        """Free blocks the step's allocation for a waiting request takes (vLLM checks it after the
        full-sequence admission check `blocks_to_hold(req, req.num_tokens)`). The same count but under the
        hybrid manager with prefix caching, where a hit may outrun a sliding group's admission cap."""
        if self.hybrid_kv is not None and self.prefix_cache is not None:
            return self._plan().blocks_to_hold(req, num_tokens, admission=False)
        return self.blocks_to_hold(req, num_tokens)

    def blocks_freed(self, req: Request) -> int:
        """Blocks that preempting running `req` returns to the free pool: all it holds, or with prefix
        caching only those no other request still holds (successive calls in one step compose)."""
        if self.prefix_cache is None:
            return req.num_blocks
        return self._plan().release(req)

    def take(self, req: Request, num_tokens: int) -> None:
        """Tell the view that `req` is scheduled to hold KV for `num_tokens` tokens after this step. The
        one write a policy makes, to its own scratch plan: with prefix caching a request admitted later in
        the step then sees the blocks this one evicts and registers, as in vLLM. A no-op without caching."""
        if self.prefix_cache is not None and self.waiting:  # only a waiting request's hit reads the plan
            self._plan().take(req, num_tokens, self._is_new(req))

    def max_total_tokens(self, spec: RequestSpec) -> int:
        return max_total_tokens(spec, self.max_model_len)

    def num_generated_tokens(self, req: Request) -> int:
        """`req.num_generated_tokens`, also for a lazy decoder of the fast engine."""
        return req.num_generated_tokens if self.decoders is None else self.decoders.num_generated_tokens(req)

    def num_decode_growth_blocks(self) -> int:
        """Free blocks that every running request decoding one more token takes (paged KV grows by a block
        at each block boundary). O(running) here, O(1) on the fast engine."""
        d = self.decoders
        if d is not None:   # (LazyDecoders.growth, inlined: policies ask it at almost every decision)
            return d.growth_by_phase[(-d.step) % d.block_size]
        return sum(self.blocks_to_hold(r, r.num_computed_tokens + 1) for r in self.running)

    def all_running_decoding(self) -> bool:
        """Whether every running request has exactly one token to compute (a decode)."""
        if self.decoders is not None:   # a `schedule_decodes` call: every running request decodes
            return True
        return all(r.num_uncomputed_tokens == 1 and r.num_generated_tokens > 0 for r in self.running)


def max_total_tokens(spec: RequestSpec, max_model_len: int) -> int:
    """Prompt + the client's max_tokens (up to max_model_len when unset): what Orca-style and static
    schedulers reserve, since the real output length is unknown until EOS."""
    if spec.max_new_tokens is None:
        return max_model_len
    return min(spec.num_prompt_tokens + max(spec.max_new_tokens, spec.num_output_tokens), max_model_len)


class Policy(Protocol):
    """A scheduler: a frozen dataclass whose fields are its knobs. It only decides; the engine applies."""
    name: ClassVar[str]
    # Finished requests keep their slot and KV until the whole batch is done (static batching).
    holds_slots_until_drained: ClassVar[bool]

    def schedule(self, view: EngineView) -> Batch: ...

    # Optional (the fast engine's shortcut; a policy without it runs there step by step through `schedule`):
    # def schedule_decodes(self, view: EngineView) -> DecodeShortcut | None
    # Called only when every running request is decoding; must equal `schedule(view)` whenever it returns a
    # value (checked decision by decision in tests/test_decisions.py), and read running requests' progress
    # only through the view (they may be lazy). See simcore.batch.DecodeShortcut for what a quiet answer promises.

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        """KV tokens this request needs at its peak when alone; it is rejected if that never fits."""
        ...

    # Optional (a policy whose admission reserves room for drafts past `kv_tokens_needed`: TensorRT-LLM):
    # def speculation_reserve_tokens(self, speculation) -> int
    # Added to `kv_tokens_needed` by the refusal on arrival (simcore/rules.py) when the run speculates.
