"""The static, continuous and chunked-prefill decision rules over the fast engine's flat state.

Line for line the rules of `policies/static.py`, `policies/continuous.py` and `policies/chunked_prefill.py`
(which stay the reference: tests/test_fastpath.py checks both give identical runs), read from per-request
lists instead of `Request` objects. Each rule also recognises the common quiet case, "every running request
decodes one token and nothing else happens", without walking the running set, and says so with QUIET: the
engine then advances a whole stretch of such steps at once. Keyed by the policy's `name` and knob names
(simcore does not import concrete policies); an unknown knob makes a policy unsupported, never misread.
"""
from __future__ import annotations

import dataclasses

from simcore.kvcache import cdiv

QUIET = "quiet"   # all running requests decode one token; no admission, no preemption

# The knobs each rule set reproduces, and the values it supports (None: any value).
RULE_FIELDS = {
    "static": {"max_num_seqs": None, "batch_timeout_s": None},
    "continuous": {"max_num_seqs": None, "max_num_batched_tokens": None, "kv_reservation": None,
                   "mix_prefill_decode": None, "watermark": None},
    "chunked_prefill": {"max_num_seqs": None, "max_num_batched_tokens": None,
                        "long_prefill_token_threshold": None, "scheduling_policy": ("fcfs",)},
}


def knobs(policy) -> dict:
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)} if dataclasses.is_dataclass(policy) else {}


def unsupported_reason(policy) -> str | None:
    """None when `make_rules(policy)` reproduces the policy exactly, else why not."""
    name = getattr(policy, "name", None)
    if name not in RULE_FIELDS:
        return f"policy {name!r} has no fast-path rules"
    have, known = knobs(policy), RULE_FIELDS[name]
    if set(have) != set(known):
        return f"policy {name} has knobs the fast path does not know: {sorted(set(have) ^ set(known))}"
    for k, allowed in known.items():
        if allowed is not None and have[k] not in allowed:
            return f"{name} with {k}: {have[k]} is not modelled by the fast path"
    return None


def make_rules(policy, num_total_blocks: int):
    reason = unsupported_reason(policy)
    if reason:
        raise ValueError(reason)
    return {"static": StaticRules, "continuous": ContinuousRules,
            "chunked_prefill": ChunkedPrefillRules}[policy.name](policy, num_total_blocks)



def _walk_running(e, running: list, budget: int, free: int, tokens):
    """Walk `running` in order giving request r `tokens(r, budget_left)` new tokens; when its KV growth
    does not fit, preempt the tail (most recently admitted) until it does or r preempted itself. This is
    vLLM V1's phase A and V0's decode pass (policies/chunked_prefill.py, policies/continuous.py).
    Pops victims off `running`; returns (scheduled, preempted, budget, free)."""
    comp, blocks, bs = e.comp, e.blocks, e.bs
    scheduled, preempted = [], []
    i = 0
    while i < len(running) and budget > 0:
        r = running[i]
        n = tokens(r, budget)
        need = max(0, cdiv(comp[r] + n, bs) - blocks[r])
        while need > free:
            victim = running.pop()
            preempted.append(victim)
            free += blocks[victim]
            if victim == r:
                break
        if preempted and preempted[-1] == r:
            break
        scheduled.append((r, n, 0))
        free -= need
        budget -= n
        i += 1
    return scheduled, preempted, budget, free

class ChunkedPrefillRules:
    name, static = "chunked_prefill", False

    def __init__(self, p, num_total_blocks: int):
        self.max_num_seqs, self.budget, self.threshold = p.max_num_seqs, p.max_num_batched_tokens, p.long_prefill_token_threshold
        self.grows = True   # paged KV: a decode needs a new block every block_size tokens

    def kv_tokens_needed(self, e, r: int) -> int:
        return e.prompt[r] + e.out[r]

    @staticmethod
    def _cap(n: int, budget: int, threshold: int) -> int:
        return min(threshold if 0 < threshold < n else n, budget)

    def decide(self, e, now: float):
        run, free = e.run, e.total - e.used
        # as ChunkedPrefill: no long_prefill_token_threshold for a request that is alone
        threshold = self.threshold if len(run) + len(e.waiting) > 1 else 0
        if not e.pref and len(run) <= self.budget:
            growth = e.decode_growth()
            if growth <= free:
                admitted = self._phase_b(e, self.budget - len(run), free - growth, len(run), threshold)
                if not admitted:
                    return QUIET
                return admitted, [], None, True   # every running request decodes, plus admissions
        return self._general(e, threshold)

    def _phase_b(self, e, budget: int, free: int, num_seqs: int, threshold: int) -> list:
        if not e.waiting:
            return []
        out, prompt, gen, comp, blocks, bs = [], e.prompt, e.gen, e.comp, e.blocks, e.bs
        for r in e.waiting:
            if budget <= 0 or num_seqs >= self.max_num_seqs:
                break
            total = prompt[r] + gen[r]
            n = self._cap(total - comp[r], budget, threshold)
            if max(0, cdiv(total, bs) - blocks[r]) > free:
                break  # head-of-line blocking
            out.append((r, n, 0))
            free -= max(0, cdiv(comp[r] + n, bs) - blocks[r])
            budget -= n
            num_seqs += 1
        return out

    def _general(self, e, threshold: int):
        """ChunkedPrefill.schedule, verbatim over the engine's lists."""
        e.materialize()
        budget, free = self.budget, e.total - e.used
        prompt, gen, comp = e.prompt, e.gen, e.comp
        running = list(e.run)
        scheduled, preempted, budget, free = _walk_running(
            e, running, budget, free, lambda r, left: self._cap(prompt[r] + gen[r] - comp[r], left, threshold))
        if not preempted:
            scheduled += self._phase_b(e, budget, free, len(running), threshold)
        return scheduled, preempted, None, False


class ContinuousRules:
    name, static = "continuous", False

    def __init__(self, p, num_total_blocks: int):
        self.max_num_seqs, self.budget, self.mixed = p.max_num_seqs, p.max_num_batched_tokens, p.mix_prefill_decode
        self.reserve_max = p.kv_reservation == "max"
        self.grows = not self.reserve_max
        self.watermark_blocks = 0 if self.reserve_max else int(p.watermark * num_total_blocks)

    def kv_tokens_needed(self, e, r: int) -> int:
        return e.maxtot[r] if self.reserve_max else e.prompt[r] + e.out[r]

    def decide(self, e, now: float):
        run, free = e.run, e.total - e.used
        if not self.mixed:
            prefills = self._prefill_pass(e, len(run), free, self.budget)
            if prefills:
                return prefills, [], None, False   # a prefill-only step: decodes wait
            if len(run) <= self.budget:
                if e.decode_growth() <= free:
                    return QUIET
            return self._decode_general(e)
        if len(run) <= self.budget:
            growth = e.decode_growth()
            if growth <= free:
                prefills = self._prefill_pass(e, len(run), free - growth, self.budget - len(run))
                if not prefills:
                    return QUIET
                return prefills, [], None, True
        return self._decode_general(e)

    def _prefill_pass(self, e, num_seqs: int, free: int, budget: int) -> list:
        if not e.waiting:
            return []
        out, prompt, gen, comp, blocks, bs, maxtot = [], e.prompt, e.gen, e.comp, e.blocks, e.bs, e.maxtot
        for r in e.waiting:
            total = prompt[r] + gen[r]
            n = total - comp[r]
            if n > budget or num_seqs >= self.max_num_seqs:
                break
            reserve = maxtot[r] if self.reserve_max else 0
            need = max(0, cdiv(max(total, reserve), bs) - blocks[r])
            if free - need < self.watermark_blocks:
                break
            out.append((r, n, reserve))
            free -= need
            budget -= n
            num_seqs += 1
        return out

    def _decode_general(self, e):
        """Continuous._decode_pass (and, when mixed, the prefill pass after it), verbatim."""
        e.materialize()
        free, budget = e.total - e.used, self.budget
        running = list(e.run)
        decodes, preempted, budget, free = _walk_running(e, running, budget, free, lambda r, left: 1)
        if self.mixed and not preempted:
            decodes += self._prefill_pass(e, len(running), free, budget)
        return decodes, preempted, None, False


class StaticRules:
    name, static = "static", True
    grows = False

    def __init__(self, p, num_total_blocks: int):
        self.max_num_seqs, self.batch_timeout_s = p.max_num_seqs, p.batch_timeout_s

    def kv_tokens_needed(self, e, r: int) -> int:
        return e.maxtot[r]

    def decide(self, e, now: float):
        if e.run:
            return QUIET  # the batch in flight decodes in lock-step until it drains
        waiting = e.waiting
        deadline_s = e.arrival[waiting[0]] + self.batch_timeout_s
        if len(waiting) < self.max_num_seqs and now < deadline_s:
            return deadline_s
        members, prompt_len, max_new = [], 0, 0
        free, prompt, maxtot, bs = e.total - e.used, e.prompt, e.maxtot, e.bs
        for r in waiting:
            if len(members) == self.max_num_seqs:
                break
            p = max(prompt_len, prompt[r])
            m = max(max_new, maxtot[r] - prompt[r])
            if (len(members) + 1) * cdiv(p + m, bs) > free:
                break
            members.append(r)
            prompt_len, max_new = p, m
        e.static_prompt_len = prompt_len
        total_len = prompt_len + max_new
        return [(r, prompt[r], total_len) for r in members], [], (len(members), prompt_len, 0), False
