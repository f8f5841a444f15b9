"""Decision-level equality of the two engines: random engine states (waiting and running sets, progress,
free blocks, priorities) built once as the SimPy engine's request records and once as the fast engine's
(decoders lazy, their stale progress fields scrambled), every policy -> the identical Batch. A quiet
shortcut answer is also checked to stay true for the next decode-only steps, as it promises."""

import re
from collections import deque

import numpy as np
import pytest

from simcore.batch import Batch, DecodeShortcut, Scheduled
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits, SimulationError
from simcore.fast.engine import FastEngine
from simcore.fast.request import FastRequest
from simcore.kvcache import cdiv
from simcore.request import Request, RequestSpec, Status
from simcore.view import EngineView
from policies.static import StaticBatchState
from policies.sglang import SglangState
from policies.tgi import TgiState
from tests.helpers import policy_id, policy_key
from tests.test_fastpath import OTHER_POLICIES, POLICIES

BS, MML = 4, 512
SCRAMBLED = -10**6
# shortcuts that answer only when the state is steady and nothing moves the decision: more random states
NUM_STATES = {"tgi": 1000, "trtllm": 1000, "sglang": 1000}   # a lazy decoder's stale fields: a shortcut that reads them fails loudly


def reserves(policy) -> bool:
    """Whether the policy holds KV to a request's end from admission (else tight paged KV)."""
    return (policy.name in ("static", "tgi") or getattr(policy, "kv_reservation", "") == "max"
            or getattr(policy, "capacity_scheduler_policy", "") == "GUARANTEED_NO_EVICT")


def random_records(policy, rng):
    """(waiting, running, draining) Request records of one random state."""
    n = int(rng.integers(1, 14))
    arrivals = np.sort(rng.uniform(0, 10, n))
    static_gen = int(rng.integers(1, 6))
    waiting, running, draining = [], [], []
    for i in range(n):
        p, o = int(rng.integers(1, 120)), int(rng.integers(2, 40))
        m = None if rng.random() < 0.5 else o + int(rng.integers(0, 20))
        spec = RequestSpec(i, float(arrivals[i]), p, o, m, priority=int(rng.integers(0, 3)))
        req = Request(spec)
        kind = rng.choice(["new", "preempted", "decoding", "prefilling", "draining"])
        if policy.name == "static":
            kind = "new" if running == [] and kind in ("new", "preempted") else ("decoding" if kind != "draining" else kind)
        if kind in ("new", "preempted"):
            if kind == "preempted":
                req.num_generated_tokens, req.num_preemptions = int(rng.integers(1, o)), int(rng.integers(1, 3))
                if policy.name in ("continuous", "chunked_prefill") and rng.random() < 0.5:   # swapped to host
                    req.status, req.num_computed_tokens = Status.SWAPPED, p + req.num_generated_tokens - 1
                    req.num_blocks = cdiv(req.num_computed_tokens, BS)
                    waiting.insert(0, req)   # preempted requests go to the front
                    continue
            waiting.append(req)
            continue
        if kind == "draining" and policy.name != "static":
            kind = "decoding"
        gen = static_gen if policy.name == "static" else int(rng.integers(1, o))
        if kind == "prefilling":
            req.num_computed_tokens = int(rng.integers(0, p))
        elif kind == "draining":
            req.num_generated_tokens = o
            req.num_computed_tokens = p + o - 1
        else:
            gen = min(gen, o - 1)
            req.num_generated_tokens, req.num_computed_tokens = gen, p + gen - 1
        tokens = policy.kv_tokens_needed(spec, MML) if reserves(policy) else req.num_computed_tokens
        req.num_blocks = cdiv(max(tokens, req.num_computed_tokens), BS)
        req.status = Status.DRAINING if kind == "draining" else Status.RUNNING
        req.admitted_s = req.first_token_s = req.last_token_s = float(arrivals[i]) + 0.5
        (draining if kind == "draining" else running).append(req)
    if policy.name == "static" and not running:
        draining = []
    if policy.name != "trtllm" or rng.random() < 0.5:   # (TRT-LLM's shortcut needs arrival order, as its runs keep)
        rng.shuffle(running)   # admission order is not arrival order
    return waiting, running, draining


def fast_copy(req: Request) -> FastRequest:
    f = FastRequest(req.spec)
    for k in Request.__slots__:
        if k != "spec":
            setattr(f, k, getattr(req, k))
    return f


def fast_engine(policy, waiting, running, draining, num_gpu_blocks, state, rng) -> FastEngine:
    e = FastEngine(policy, ConstantCost(), EngineLimits(num_gpu_blocks, BS, MML), [])
    e.waiting, e.running, e.draining = (deque(map(fast_copy, waiting)), [fast_copy(r) for r in running],
                                        [fast_copy(r) for r in draining])
    e.by_id = {r.request_id: r for r in (*e.waiting, *e.running, *e.draining)}
    e.pool.num_used_blocks = sum(r.num_blocks for r in (*running, *draining))
    e.policy_state, e.decoders.step = state, int(rng.integers(0, 50))
    for k, req in enumerate(e.running):
        req.order = k
    e.num_admissions = len(e.running)
    e.prefilling = {r for r in e.running if not (r.num_uncomputed_tokens == 1 and r.num_generated_tokens > 0)}
    if e.shortcut is not None:   # as the engine keeps them: every decoding running request lazy
        for req in e.running:
            if req not in e.prefilling:
                e.decoders.add(req)
                req.num_computed_tokens = req.num_generated_tokens = SCRAMBLED
    return e


def expand(shortcut: DecodeShortcut, running, state) -> Batch:
    decodes = tuple(Scheduled(r.request_id, 1) for r in running) if shortcut.decode_running else ()
    return Batch(decodes + shortcut.admitted, padded_shape=shortcut.padded_shape, policy_state=state)


def growth(running) -> int:
    return sum(max(0, cdiv(r.num_computed_tokens + 1, BS) - r.num_blocks) for r in running)


def decode_step(running, free: int) -> int | None:
    """Apply the quiet step just decided (every running request one decode token, paged growth) in place;
    the free blocks left, or None when the promise ends: a request finished, or the next step's growth
    does not fit."""
    if any(r.num_generated_tokens + 1 >= r.spec.num_output_tokens for r in running):
        return None
    free -= growth(running)
    for r in running:
        r.num_computed_tokens += 1
        r.num_generated_tokens += 1
        r.num_blocks = max(r.num_blocks, cdiv(r.num_computed_tokens, BS))
    return free if growth(running) <= free else None


@pytest.mark.parametrize("policy", POLICIES + OTHER_POLICIES, ids=policy_id)
def test_both_engines_decide_the_same_on_random_states(policy):
    rng = np.random.default_rng(policy_key(policy))
    num_shortcuts = num_quiet = 0
    for _ in range(NUM_STATES.get(policy.name, 300)):
        waiting, running, draining = random_records(policy, rng)
        if not (waiting or running):
            continue
        used = sum(r.num_blocks for r in (*running, *draining))
        free = int(rng.integers(0, 40))
        state = random_tgi_state(policy, rng) if policy.name == "tgi" else None
        state = random_sglang_state(policy, waiting, running, rng) if policy.name == "sglang" else state
        if policy.name == "static" and running and rng.random() < 0.5:   # the batch's state, as carried
            state = StaticBatchState(max(r.num_prompt_tokens for r in (*running, *draining)))
        now = 11.0 + float(rng.random())
        engine = fast_engine(policy, waiting, running, draining, used + free + 1, state, rng)
        view = EngineView(now, deque(waiting), list(running), free, used + free, BS, MML, list(draining), state)
        try:
            expected = policy.schedule(view)
        except SimulationError as e:   # a state the policy refuses (SGLang's out-of-memory abort): so must both
            with pytest.raises(SimulationError, match=re.escape(str(e))):
                engine.decide(now)
            continue
        fast = engine.decide(now)
        if isinstance(fast, DecodeShortcut):
            num_shortcuts += 1
            assert expand(fast, running, state) == expected
            if fast.is_quiet:
                num_quiet += 1
                shape = fast.padded_shape
                for _ in range(3):   # the promise: the same decision until an arrival, a finish or no room
                    free = decode_step(running, free)
                    if free is None:
                        break
                    shape = shape and tuple((1, c + 1) for _, c in shape)
                    view = EngineView(now, deque(waiting), list(running), free, used + free, BS, MML,
                                      list(draining), state)
                    assert policy.schedule(view) == Batch(tuple(Scheduled(r.request_id, 1) for r in running),
                                                          padded_shape=shape, policy_state=state)
        else:
            assert fast == expected
    if getattr(policy, "schedule_decodes", None) is not None:   # (TGI offers it only with chunking)
        assert num_shortcuts > 30 and num_quiet > 5   # the shortcut is exercised, quiet answers included


def random_tgi_state(policy, rng) -> TgiState:
    """TGI's state as the engine carries it, often steady (the counter at max_waiting_tokens, no decode owed)."""
    count = policy.max_waiting_tokens if rng.random() < 0.5 else int(rng.integers(1, 30))
    return TgiState(count, bool(rng.random() < 0.3))


def random_sglang_state(policy, waiting, running, rng) -> SglangState:
    """SGLang's state as the engine carries it: the ratio often at its floor (where the shortcut applies),
    the batch often not full, else marked full for (a subset of) the running requests or for one that left;
    some retracted requests re-queued at a later time."""
    ratio = (policy.min_ratio, policy.min_ratio, policy.init_ratio, float(rng.uniform(policy.min_ratio, 1.0)))
    ids = [r.request_id for r in running]
    full = (None, None, frozenset(ids), frozenset(ids[:int(rng.integers(0, len(ids) + 1))]), frozenset(ids) | {99})
    requeued = tuple((r.request_id, 10.5) for r in waiting if r.num_preemptions > 0 and rng.random() < 0.5)
    return SglangState(ratio[int(rng.integers(0, 4))], full[int(rng.integers(0, 5))], requeued)
