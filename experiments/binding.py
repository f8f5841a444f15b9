"""What binds at one point: from the engine's own iteration log, why a waiting request was left waiting at each
step (the sequence cap, the token budget, KV blocks, the scheduler's own rule, or nothing waited), and from
the roofline's terms whether a step's GPU time went to compute or to memory traffic (weights, KV reads).

Read from the log after the run, not from utilisation or KV occupancy alone: the queue a step left behind
(less the requests that arrived while it ran) is who the scheduler did not admit, and the step's own counts
say which limit it stood at. Approximations: the head of the queue is taken in FCFS order (a priority
scheduler's head may differ), and a prefill's cached context is not in the log (its attention is priced as
if none was cached).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# Why a request that waited at a step's decision was not admitted; "demand": nothing waited.
LIMITS = ("demand", "max_num_seqs", "token_budget", "kv", "policy")
DEMAND, SEQS, TOKENS, KV, POLICY = range(len(LIMITS))
LIMIT_WORDS = {"demand": "demand (nothing waited)", "max_num_seqs": "the sequence cap (max_num_seqs)",
               "token_budget": "the token budget", "kv": "KV capacity",
               "policy": "the scheduler's own rule (a batch in progress or an output reservation)",
               "compute": "the GPU's compute", "bandwidth": "the GPU's memory bandwidth"}

# Each policy's names for its sequence cap and its per-step token budget, and whether it chunks prefills
# (a chunking scheduler admits a prompt into any budget left; the others need the whole prompt to fit).
POLICY_KNOBS = {
    "chunked_prefill": ("max_num_seqs", "max_num_batched_tokens", lambda p: True),
    "continuous": ("max_num_seqs", "max_num_batched_tokens", lambda p: False),
    "static": ("max_num_seqs", None, lambda p: False),
    "tgi": ("max_batch_size", "max_batch_prefill_tokens", lambda p: bool(p.prefill_chunking)),
    "trtllm": ("max_batch_size", "max_num_tokens", lambda p: bool(p.enable_chunked_context)),
    "sglang": ("max_running_requests", "chunked_prefill_size", lambda p: True),
}

SERVED_COLUMNS = ["replica_id", "arrival_s", "admitted_s", "finish_s", "prompt_tokens", "output_tokens", "status"]
STEP_COLUMNS = ["start_s", "duration_s", "prefill_tokens", "decode_tokens", "padding_tokens", "num_seqs",
                "num_preempted", "num_waiting", "num_running", "kv_blocks_used", "replica_id"]


@dataclass(frozen=True)
class AdmissionLimits:
    """A policy's admission limits as numbers (None where it has none)."""
    max_num_seqs: int | None
    token_budget: int | None
    chunks_prefill: bool


def admission_limits(policy) -> AdmissionLimits:
    seqs, tokens, chunks = POLICY_KNOBS.get(policy.name, (None, None, lambda p: False))
    value = lambda k: getattr(policy, k, None) if k else None  # noqa: E731
    return AdmissionLimits(value(seqs), value(tokens), chunks(policy))


def served_by_replica(served: pd.DataFrame, block_size: int) -> list[tuple]:
    """Per replica, what `step_limits` looks up about its served requests (`lookup_by_replica` over the
    frame's columns)."""
    return lookup_by_replica(served["replica_id"].to_numpy(), served["arrival_s"].to_numpy(float),
                             served["admitted_s"].to_numpy(float), served["finish_s"].to_numpy(float),
                             served["prompt_tokens"].to_numpy(), served["output_tokens"].to_numpy(),
                             (served["status"] == "finished").to_numpy(), block_size)


def lookup_by_replica(replica: np.ndarray, arrival_s: np.ndarray, admitted_s: np.ndarray, finish_s: np.ndarray,
                      prompt_tokens: np.ndarray, output_tokens: np.ndarray, finished: np.ndarray, block_size: int,
                      rows: np.ndarray | None = None) -> list[tuple]:
    """Per replica (in replica order), what `step_limits` looks up about the served requests at `rows` (default:
    all) of these columns: (replica, arrivals sorted, admissions made nondecreasing in arrival order, prompts
    in that order, (finish times sorted and distinct, KV blocks freed at each)). numpy arrays only, about 40
    bytes a request: a day's millions of requests are never copied as a frame."""
    rows = np.arange(len(replica)) if rows is None else rows
    rep = replica[rows]
    rows = rows[np.lexsort((arrival_s[rows], rep))]   # by replica, then arrival (stable: ties keep row order)
    rep = replica[rows]
    cuts = np.flatnonzero(np.diff(rep)) + 1
    out = []
    for seg in np.split(rows, cuts) if len(rows) else []:
        # FCFS admits in arrival order: the head at time t is the first whose admission (or any earlier
        # one's) comes after t
        admitted = np.fmax.accumulate(np.nan_to_num(admitted_s[seg], nan=np.inf))
        fin = seg[finished[seg]]
        blocks = -(-(prompt_tokens[fin] + output_tokens[fin] - 1).astype(np.int64) // block_size)
        order = np.argsort(finish_s[fin], kind="stable")
        ends, first = np.unique(finish_s[fin][order], return_index=True)
        freed = np.add.reduceat(blocks[order], first) if len(first) else np.zeros(0, dtype=np.int64)
        out.append((replica[seg[0]].item(), arrival_s[seg], admitted, prompt_tokens[seg], (ends, freed)))
    return out


def _freed_at(by_end: tuple, t: np.ndarray) -> np.ndarray:
    """KV blocks freed by requests finishing at exactly each time of `t` (0 where none finished)."""
    ends, freed = by_end
    if not len(ends):
        return np.zeros(len(t), dtype=np.int64)
    k = np.minimum(np.searchsorted(ends, t), len(ends) - 1)
    return np.where(ends[k] == t, freed[k], 0).astype(np.int64)


def step_limits(it: pd.DataFrame, served: pd.DataFrame | None, limits: AdmissionLimits, num_blocks: int,
                block_size: int, watermark_blocks: int = 0, lookup: list | None = None) -> np.ndarray:
    """One code per step (LIMITS index): why the requests still waiting after the step's decision were not
    admitted. Waiting at the decision = the queue the step left, less what arrived while it ran. The head
    of the queue is the earliest arrival not yet admitted (FCFS); free KV at the decision = the pool less
    what the step left used and what its finishing requests freed at its end. A step that preempted stood
    at KV; else the first limit it reached: its sequence cap, its token budget (spent, or too little left
    for the head's whole prompt when the policy does not chunk), its free KV blocks (fewer than the head's
    prompt, or chunk, needs, beyond the policy's watermark); else the policy chose to wait. `lookup`:
    `served_by_replica(served, block_size)` made once (a streamed run's steps come in chunks)."""
    codes = np.full(len(it), DEMAND, dtype=np.int8)
    if not len(it):
        return codes
    start = it["start_s"].to_numpy(float)
    end = start + it["duration_s"].to_numpy(float)
    replica = it["replica_id"].to_numpy() if "replica_id" in it else np.zeros(len(it), dtype=int)
    arrived = np.zeros(len(it), dtype=np.int64)
    head_prompt = np.ones(len(it))
    freed = np.zeros(len(it), dtype=np.int64)
    for r, a, admitted, prompts, by_end in (lookup if lookup is not None else served_by_replica(served, block_size)):
        mask = replica == r
        if not mask.any():
            continue
        arrived[mask] = np.searchsorted(a, end[mask], "right") - np.searchsorted(a, start[mask], "right")
        head = np.minimum(np.searchsorted(admitted, start[mask], "right"), len(a) - 1)
        head_prompt[mask] = prompts[head]
        freed[mask] = _freed_at(by_end, end[mask])
    waited = it["num_waiting"].to_numpy() - arrived > 0
    tokens = (it["prefill_tokens"] + it["decode_tokens"] + it["padding_tokens"]).to_numpy().astype(float)
    free = num_blocks - it["kv_blocks_used"].to_numpy() - freed - watermark_blocks
    budget_left = np.full(len(it), np.inf) if limits.token_budget is None else limits.token_budget - tokens
    if limits.chunks_prefill:
        budget_spent = budget_left <= 0
        need_tokens = np.minimum(head_prompt, np.maximum(budget_left, 1))
    else:
        budget_spent = budget_left < head_prompt
        need_tokens = head_prompt
    kv_short = free < np.ceil(need_tokens / block_size)
    seqs_full = (it["num_seqs"].to_numpy() >= limits.max_num_seqs if limits.max_num_seqs is not None
                 else np.zeros(len(it), dtype=bool))
    codes[waited] = POLICY
    # assigned from the last rule to the first, so that the first that holds wins
    codes[waited & kv_short] = KV
    codes[waited & budget_spent] = TOKENS
    codes[waited & seqs_full] = SEQS
    codes[waited & (it["num_preempted"].to_numpy() > 0)] = KV
    return codes


def limit_fractions(codes: np.ndarray, it: pd.DataFrame, idle_s: float) -> dict:
    """Per limit, the share of steps and of simulated time (steps weighted by their duration; time the
    engine sat idle counts as demand) at which it held: `bind_<limit>_steps`, `bind_<limit>_time`."""
    n = max(1, len(codes))
    dur = it["duration_s"].to_numpy(float) if len(it) else np.zeros(0)
    total = float(dur.sum()) + idle_s
    out = {}
    for i, name in enumerate(LIMITS):
        hit = codes == i
        out[f"bind_{name}_steps"] = float(hit.sum()) / n
        t = float(dur[hit].sum()) + (idle_s if i == DEMAND else 0.0)
        out[f"bind_{name}_time"] = t / total if total > 0 else float("nan")
    return out


def idle_time_s(it: pd.DataFrame) -> float:
    """Simulated time each replica spent with no step in flight, summed, from its first step to its last."""
    total = 0.0
    groups = it.groupby("replica_id") if "replica_id" in it else [(0, it)]
    for _, g in groups:
        s = g["start_s"].to_numpy(float)
        e = s + g["duration_s"].to_numpy(float)
        total += max(0.0, float(e.max() - s.min() - g["duration_s"].sum())) if len(g) else 0.0
    return total


# How each roofline term spends its time (costmodels/roofline.py `step_terms_s`): GEMMs read weights or are
# compute-limited by their token count; attention over cached KV reads KV; the rest is activations in and
# out of HBM, links between GPUs, or the CPU's scheduling time left after async overlap.
GEMM_TERMS = ("attention_gemms", "dense_mlp", "moe_router_shared", "routed_experts", "lm_head_sampling")
TERM_RESOURCE = {"prefill_attention": "compute", "decode_attention": "kv", "elementwise": "activations",
                 "embedding": "activations", "allreduce": "links", "alltoall": "links", "pipeline_sends": "links",
                 "per_step": "cpu", "per_request": "cpu", "async_overlap": "cpu"}
RESOURCES = ("compute", "weights", "kv", "activations", "links", "cpu")
MEMORY = ("weights", "kv", "activations")
NUM_SAMPLED_STEPS = 400   # steps priced term by term, evenly spread over the run (a share, not a total)


def gemms_compute_bound(roofline, num_tokens: int) -> bool:
    """Whether the dense layer's largest GEMM at `num_tokens` rows takes longer in FLOPs than in bytes on
    this GPU (the roofline's own max of the two, costmodels/roofline.py `_gemm_s`)."""
    n, k = max(roofline.layer_gemms, key=lambda nk: nk[0] * nk[1])
    flops_s, bytes_s = roofline.gemm_sides_s(num_tokens, n, k)
    return flops_s >= bytes_s


def step_resources_s(roofline, prefill_tokens: int, num_prefills: int, num_decodes: int,
                     decode_context: int) -> dict[str, float]:
    """Seconds of one step by resource (RESOURCES), from the roofline's terms for a step of that shape:
    `num_prefills` equal chunks, `num_decodes` decodes of `decode_context` tokens each."""
    prefill = [(max(1, prefill_tokens // num_prefills), 0)] * num_prefills if num_prefills and prefill_tokens else []
    decode = [max(1, decode_context)] * num_decodes
    terms = roofline.step_terms_s(prefill=prefill, decode=decode)
    gemm = "compute" if gemms_compute_bound(roofline, prefill_tokens + num_decodes) else "weights"
    out = dict.fromkeys(RESOURCES, 0.0)
    for k, v in terms.items():
        out[gemm if k in GEMM_TERMS else TERM_RESOURCE.get(k, "cpu")] += v
    return out


def step_bounds(roofline, it: pd.DataFrame, block_size: int) -> dict:
    """Shares of GPU step time by resource over up to NUM_SAMPLED_STEPS steps evenly spread over the run,
    each weighted by its duration: `bound_<resource>_frac`; `bound_memory_steps`, the share of that time
    in steps whose memory traffic took longer than their compute; `step_bound` 'memory' or 'compute'. A
    decode's context is the KV held after the step shared out over the running requests."""
    busy = np.flatnonzero((it["prefill_tokens"].to_numpy() + it["decode_tokens"].to_numpy()) > 0)
    if not len(busy):
        return {}
    # the sampled rows only (a day's steps are tens of millions: no copy of the busy ones)
    return sampled_bounds(roofline, it.iloc[busy[sampled_busy_steps(len(busy))]], block_size)


def sampled_busy_steps(num_busy: int) -> np.ndarray:
    """Which of `num_busy` busy steps (in order) `step_bounds` prices: up to NUM_SAMPLED_STEPS, evenly spread."""
    return np.unique(np.linspace(0, num_busy - 1, min(num_busy, NUM_SAMPLED_STEPS)).astype(int))


def sampled_bounds(roofline, rows: pd.DataFrame, block_size: int) -> dict:
    """`step_bounds`' keys over the sampled busy steps `rows`."""
    totals = dict.fromkeys(RESOURCES, 0.0)
    memory_time = weight = 0.0
    for r in rows.itertuples(index=False):
        num_decodes = int(r.decode_tokens)
        ctx = int(r.kv_blocks_used) * block_size // max(1, int(r.num_running))
        res = step_resources_s(roofline, int(r.prefill_tokens), max(0, int(r.num_seqs) - num_decodes),
                               num_decodes, ctx)
        gpu = sum(v for k, v in res.items() if k != "cpu") or 1.0
        w = float(r.duration_s)
        for k in RESOURCES:
            if k != "cpu":
                totals[k] += w * res[k] / gpu
        weight += w
        if sum(res[k] for k in MEMORY) > res["compute"]:
            memory_time += w
    out = {f"bound_{k}_frac": totals[k] / weight for k in RESOURCES if k != "cpu"}
    out["bound_memory_steps"] = memory_time / weight
    out["step_bound"] = "memory" if memory_time >= weight / 2 else "compute"
    return out


def admission_window(it: pd.DataFrame, last_arrival_s: float) -> np.ndarray:
    """Steps before the run drains: each replica's steps up to the first one that starts at or after the last
    arrival and leaves nothing waiting. A finite run ends with its last requests decoding and nothing left
    to admit; those steps say nothing about what bound the load, only that the workload ran out."""
    keep = np.ones(len(it), dtype=bool)
    replica = it["replica_id"].to_numpy() if "replica_id" in it else np.zeros(len(it), dtype=int)
    start, waiting = it["start_s"].to_numpy(float), it["num_waiting"].to_numpy()
    for r in np.unique(replica):
        idx = np.flatnonzero(replica == r)
        drained = idx[(start[idx] >= last_arrival_s) & (waiting[idx] == 0)]
        if len(drained):
            keep[idx[idx > drained[0]]] = False
    return keep


def binding_keys(policy, requests: pd.DataFrame, it: pd.DataFrame, num_blocks: int, block_size: int,
                 roofline=None, fell_behind: bool = False) -> dict:
    """The results-row keys of this module over the steps before the run drains (`admission_window`):
    `bind_<limit>_steps` / `_time`, with a roofline of the deployment the `bound_*` keys (over every step),
    and `binding` (`binding_name`). `fell_behind`: the run did not keep up with its load (unstable, or
    every request at once)."""
    served = requests.loc[requests["status"] != "rejected", SERVED_COLUMNS]
    if not len(it) or not len(served):
        return {}
    keep = admission_window(it, float(served["arrival_s"].max()))
    window = it if keep.all() else it[keep]
    watermark = int(getattr(policy, "watermark", 0.0) * num_blocks)   # vLLM V0 keeps 1% free at admission
    codes = step_limits(window, served, admission_limits(policy), num_blocks, block_size, watermark)
    out = limit_fractions(codes, window, idle_time_s(window))
    if roofline is not None:
        out.update(step_bounds(roofline, it, block_size))
    out["binding"] = binding_name(out, fell_behind)
    return out


GPU_LIMITS = ("compute", "bandwidth")
# A limit that leaves a request waiting at one step in ten sets the queueing tail (p99 TTFT is the worst 1%
# of requests): it binds even when nothing waited at most steps. Confirmed or refuted per point by
# experiments.diagnose, which relaxes it.
QUEUE_STEPS_SHARE = 0.10


def binding_name(keys: dict, fell_behind: bool) -> str:
    """The limit other than demand that held at the most steps, if it held at QUEUE_STEPS_SHARE of them,
    else demand; but when the run fell behind its load and either nothing
    waited (the backlog sat in running prefills) or the steps are no longer memory-bound with the weights
    as their largest term, the GPU itself: 'compute' or 'bandwidth', as most of the steps' time was bound
    (`step_bound`). A bigger batch pays only for what a step shares out, the weights read once per step;
    past that, admitting more adds work that costs as much per request as before."""
    top = max(LIMITS[1:], key=lambda name: keys[f"bind_{name}_steps"])
    if keys[f"bind_{top}_steps"] < QUEUE_STEPS_SHARE:
        top = "demand"
    if not fell_behind or "bound_weights_frac" not in keys or top == "policy":
        return top
    weights_lead = keys["bound_weights_frac"] >= max(keys[f"bound_{k}_frac"] for k in RESOURCES if k != "cpu")
    if top != "demand" and keys["step_bound"] == "memory" and weights_lead:
        return top
    return "compute" if keys["step_bound"] == "compute" else "bandwidth"


def binding_sentence(row, load: str = "") -> str:
    """One sentence on what bound a results row ('' when it has no binding keys)."""
    name = row.get("binding") if hasattr(row, "get") else None
    if not isinstance(name, str) or name not in LIMIT_WORDS:
        return ""
    steps = row.get(f"bind_{name}_steps", float("nan"))  # (a GPU limit has none: not read for it)
    where = f"at {load} " if load else ""
    if name in GPU_LIMITS:
        top = max(LIMITS, key=lambda k: row.get(f"bind_{k}_steps", 0.0))
        held = (f"nothing waited in {row.get('bind_demand_steps', 0.0):.0%} of steps (the backlog was in running "
                "prefills)" if top == "demand" else
                f"{LIMIT_WORDS[top]} held back a waiting request in {row.get(f'bind_{top}_steps', 0.0):.0%} of steps, "
                "but the weights are not what the steps spend most on, so a bigger batch would not pay")
        words = f"{where}{LIMIT_WORDS[name]} binds: the run fell behind its load; {held}"
    elif name == "demand":
        words = f"{where}demand binds: in {steps:.0%} of steps nothing waited to be admitted"
    else:
        words = f"{where}{LIMIT_WORDS[name]} binds: in {steps:.0%} of steps a waiting request was not admitted"
        words += {"max_num_seqs": " because every sequence slot was taken",
                  "token_budget": " because the step's token budget was spent",
                  "kv": " for want of free KV blocks (or was preempted)",
                  "policy": " though slots, budget and KV were free"}[name]
    bound = row.get("step_bound")
    if isinstance(bound, str):
        shares = {k: row.get(f"bound_{k}_frac", 0.0) for k in RESOURCES if k != "cpu"}
        if bound == "memory":
            top = max(MEMORY, key=lambda k: shares[k])
            words += f"; steps are memory-bound, {shares[top] / max(1e-12, sum(shares[k] for k in MEMORY)):.0%} {top}"
        else:
            words += f"; steps are compute-bound ({shares['compute']:.0%} of GPU time in FLOPs)"
    return words[0].upper() + words[1:] + "."
