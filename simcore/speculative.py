"""Speculative decoding (vLLM `speculative_config`): the acceptance model, each request's accepted-length
draws, and what a verification step does to a request record. Both engines (simcore/engine.py,
simcore/fast/engine.py) apply it through `verified`, so that they agree bitwise.

Acceptance is given as vLLM's spec-decode metrics report it, "acceptance rate per position": r_i, the share
of drafts whose i-th token was accepted (so r_i = P(at least i accepted), non-increasing), i = 1..k. One
uniform draw u per verification gives its accepted count a = #{i : u < r_i}, so P(a >= i) = r_i exactly. A
single rate alpha means each draft token is accepted with probability alpha given the ones before it
(Leviathan et al., 2023): r_i = alpha^i.

The draws of request `request_id` come from a generator seeded by (run seed, request id): its j-th
verification gets the j-th draw whatever the batching, the replica or the engine. A verification that
carried fewer drafts than k (the token budget or max_model_len cut it) accepts min(a, drafts).

What the scheduler does with it is vLLM V1's (vllm/v1/core/sched/scheduler.py): a decoding request
carries its k drafts (`Request.num_spec_tokens`, set after every step in which it sampled and did not
finish, as `update_draft_token_ids`); the scheduler gives it 1 + k tokens under the same token budget, and
KV for them plus `num_lookahead_tokens` more (EAGLE, MTP and draft models write the drafts' KV past the
verified range); after the step the rejected drafts are rolled back from `num_computed_tokens` while their
KV blocks stay allocated; the accepted tokens plus the bonus token reach the client in one chunk.

SGLang and TensorRT-LLM (`Speculation.engine`) verify the same 1 + k rows with the same draws and prices;
they differ in what they hold for the drafts (docs/speculative.md, "Per engine"): SGLang checks room for
the verification and the draft tree before a decode step (`num_lookahead_tokens`: the tree's
`speculative_eagle_topk x speculative_num_steps` slots, allocated for the draft passes and given back within
the step), TensorRT-LLM keeps `num_extra_kv_tokens` slots past each sequence (one-model EAGLE-3 and MTP:
k - 1); both give back the rejected drafts' KV after the verification (`rewind`), where vLLM keeps it.
TGI (n-gram only) reserves the drafts' KV with the whole output at admission and gives nothing back; its
server drops the batch's drafts when new requests join it (policies/speculation_counting.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("eagle", "eagle3", "mtp", "ngram", "draft_model")
# vLLM's `VllmConfig.num_lookahead_tokens`: drafters that run on the GPU write their drafts' KV beyond the
# target's query range (use_eagle() covers eagle, eagle3 and mtp; draft models too); n-gram lookup writes none.
LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
# Drafters that read the target's hidden states (vLLM's use_eagle()): a prefix-cache hit drops its last block,
# recomputed so the drafter has that position's hidden state (drop_eagle_block in vLLM's
# single_type_kv_cache_manager.py find_longest_cache_hit).
HIDDEN_STATE_METHODS = ("eagle", "eagle3", "mtp")

# Default acceptance per method, as published (docs/sources.md, "Speculative decoding"). A float is a single
# conditional rate (r_i = alpha^i), a tuple per-position rates r_1, r_2, ... (positions beyond the tuple
# repeat the decay of its last two). Conditions matter: all are single-stream chat or edit benchmarks.
DEFAULT_ACCEPTANCE = {
    # EAGLE-3 head yuhuili/EAGLE3-LLaMA3.1-Instruct-8B on Llama-3.1-8B-Instruct, MT-bench, greedy, k = 7, in
    # vLLM V1: mean acceptance length 3.53 (12,208 accepted of 33,712 drafted in 4,816 drafts), vLLM issue
    # #26191 (github.com/vllm-project/vllm/issues/26191, the earlier figure it cites from PR #17504). The
    # single rate whose geometric sum over 7 positions gives 2.53 accepted per draft: 0.743.
    "eagle3": 0.743,
    # EAGLE (1) head lmsys/sglang-EAGLE-LLaMA3-Instruct-8B on Llama-3-8B-Instruct, MT-bench, batch 1, k = 2, in
    # vLLM V1: acceptance length 1.89 (vLLM PR #16035, github.com/vllm-project/vllm/pull/16035): alpha + alpha^2
    # = 0.89, alpha = 0.568 (k = 4 in the same run: 2.08, alpha 0.542).
    "eagle": 0.568,
    # DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): "the acceptance rate of the second token
    # prediction ranges between 85% and 90% across various generation topics"; the middle, 0.875. Beyond the
    # one trained MTP module (num_nextn_predict_layers: 1) vLLM reuses it, and acceptance falls further with
    # depth than a single rate says: set `acceptance` for k > 1.
    "mtp": 0.875,
    # n-gram prompt lookup (prompt_lookup_min 2, max 5, k = 5) on a code-editing set (vdaita/edit_5k_char),
    # vLLM PR #24344 (github.com/vllm-project/vllm/pull/24344): acceptance at positions 1-5 of 0.81, 0.74,
    # 0.70, 0.68, 0.66 among drafts made. Editing repeats the prompt: the best case for n-gram. On open chat
    # the prompt rarely holds the continuation; there give your own `acceptance` (vLLM's spec-decode metrics).
    "ngram": (0.81, 0.74, 0.70, 0.68, 0.66),
    # draft_model: no default; acceptance depends on the pair of models and the text.
}

ENGINES = ("vllm", "sglang", "trtllm", "tgi")
# TensorRT-LLM's one-model drafters (the drafter runs inside the target's engine) keep max_draft_len - 1 extra
# KV slots per sequence: `get_num_extra_kv_tokens` in tensorrt_llm/_torch/speculative/utils.py.
TRTLLM_ONE_MODEL_METHODS = ("eagle3", "mtp")


def default_acceptance(method: str, k: int) -> tuple[float, ...] | None:
    """The published default for `method` at `k` drafts (see DEFAULT_ACCEPTANCE), or None."""
    d = DEFAULT_ACCEPTANCE.get(method)
    if d is None:
        return None
    if isinstance(d, float):
        return geometric(d, k)
    rates = list(d[:k])
    while len(rates) < k:   # extend by the last ratio (non-increasing, stays in [0, 1])
        rates.append(rates[-1] * (rates[-1] / rates[-2]))
    return tuple(rates)


@dataclass(frozen=True)
class Speculation:
    """A run's speculative decoding. `acceptance`: r_1..r_k as the module docstring says (checked by
    experiments/speculative_config.py). `proposer`: prices the drafting of one step (costmodels/
    speculative_proposer.py: `time_s(prefill, decode)` over the step's rows), None for a free one (the
    exact timeline tests). `seed`: the run's seed (the draws). `counters`: a `SpecCounters` the engines
    add to (shared by a cluster's replicas); None: each engine keeps its own (`spec_counters`)."""
    method: str
    num_speculative_tokens: int
    acceptance: tuple[float, ...]
    seed: int = 0
    proposer: object = None
    counters: object = None
    engine: str = "vllm"   # whose scheduling of drafts the policy follows: vllm, sglang, trtllm or tgi

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past each scheduled row the drafter needs. vLLM: `num_lookahead_tokens`, k for GPU
        drafters, held. SGLang: the draft tree's topk x num_steps slots (a chain of k for GPU drafters; one
        for n-gram, whose num_steps and topk are unset), checked and allocated within the step only.
        TensorRT-LLM: `num_extra_kv_tokens`, k - 1 for its one-model EAGLE-3 and MTP, held. TGI (n-gram):
        none; its reservation to completion holds the drafts."""
        k = self.num_speculative_tokens
        if self.engine == "sglang":
            return 1 if self.method == "ngram" else k
        if self.engine == "trtllm":
            return k - 1 if self.method in TRTLLM_ONE_MODEL_METHODS else 0
        if self.engine == "tgi":
            return 0
        return k if self.method in LOOKAHEAD_METHODS else 0

    @property
    def frees_rejected_kv(self) -> bool:
        """SGLang frees the rejected drafts' KV slots after the verification (eagle_info.py `verify`),
        TensorRT-LLM rewinds them (`rewind_kv_cache`); vLLM keeps the blocks, TGI its whole reservation."""
        return self.engine in ("sglang", "trtllm")

    @property
    def num_kept_lookahead_tokens(self) -> int:
        """Lookahead slots a request keeps between steps: all of vLLM's and TensorRT-LLM's, none of
        SGLang's (its draft tree's slots are given back within the step)."""
        return 0 if self.engine == "sglang" else self.num_lookahead_tokens

    @property
    def drops_last_hit_block(self) -> bool:
        return self.method in HIDDEN_STATE_METHODS

    @property
    def drops_last_host_chunk(self) -> bool:
        """A host-tier (KV offload) hit gives back its last chunk: vLLM's offloading connector pops the
        trailing chunk of a drafter's KV group (`is_eagle_group`, offloading/scheduler.py
        `_lookup_complete_chunks`), a group it finds for MTP, whose drafter layers trail the target's
        (kv_cache_utils.py `_uses_trailing_mtp_layers`); for EAGLE heads no group is marked and the host hit is
        kept whole (the GPU hit still drops its last block)."""
        return self.method == "mtp" and self.engine == "vllm"

    @property
    def num_draft_slots(self) -> int:
        """vLLM's `max_num_new_slots_for_drafting`: input slots per scheduled request the budget keeps for
        the drafter (a draft model keeps one unsliced input token; EAGLE, MTP and n-gram none)."""
        return 1 if self.method == "draft_model" and self.engine == "vllm" else 0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a full verification emits on average: 1 + sum of r_i."""
        return 1.0 + float(sum(self.acceptance))


def geometric(alpha: float, k: int) -> tuple[float, ...]:
    """Per-position rates of a single conditional rate `alpha`: r_i = alpha^i."""
    return tuple(float(alpha) ** i for i in range(1, k + 1))


class AcceptanceDraws:
    """Each live request's accepted counts, drawn once when it first verifies (at most one verification
    per output token, so `num_output_tokens` draws suffice), consumed in order, dropped when it leaves."""

    def __init__(self, spec: Speculation):
        self.spec = spec
        self.rates = np.asarray(spec.acceptance, dtype=np.float64)
        self.left: dict[int, list[int]] = {}   # request id -> its remaining counts, next one last

    def draws_for(self, request_id: int, num_output_tokens: int) -> list[int]:
        """The accepted counts of a request's verifications, first one first (a pure function)."""
        u = np.random.default_rng([self.spec.seed, request_id]).random(max(1, num_output_tokens))
        return (u[:, None] < self.rates[None, :]).sum(axis=1).tolist()

    def next(self, req) -> int:
        left = self.left.get(req.spec.request_id)
        if left is None:
            left = self.draws_for(req.spec.request_id, req.spec.num_output_tokens)[::-1]
            self.left[req.spec.request_id] = left
        return left.pop()

    def forget(self, request_id: int) -> None:
        self.left.pop(request_id, None)


class SpecCounters:
    """What a run's verifications did (results columns): verification steps, drafted and accepted tokens."""
    __slots__ = ("num_verifications", "num_draft_tokens", "num_accepted_tokens")

    def __init__(self):
        self.num_verifications = self.num_draft_tokens = self.num_accepted_tokens = 0


def verified(req, num_new_tokens: int, draws: AcceptanceDraws, counters: SpecCounters) -> int:
    """`req` computed `num_new_tokens` this step (its KV progress not yet advanced): advance it, roll back
    its rejected drafts, and return how many tokens it emits now (0 for a partial prefill chunk; else the
    accepted drafts plus one, at most what it has left to generate). The caller samples that many tokens
    (one ITL chunk) and gives it new drafts if it goes on (`num_spec_tokens`)."""
    total = req.spec.num_prompt_tokens + req.num_generated_tokens
    c = req.num_computed_tokens + num_new_tokens
    real = req.num_spec_tokens   # drafted tokens; beyond them a row carries placeholders (vLLM's padding)
    req.num_spec_tokens = 0   # vLLM clears the drafts once scheduled; new ones come after the step
    drafts = c - total
    if drafts < 0:
        req.num_computed_tokens = c
        return 0
    accepted = 0
    if drafts > 0 and real > 0:
        if real > drafts:
            real = drafts
        accepted = draws.next(req)
        if accepted > real:
            accepted = real
        counters.num_verifications += 1
        counters.num_draft_tokens += real
        counters.num_accepted_tokens += accepted
    req.num_computed_tokens = c - (drafts - accepted)
    left = req.spec.num_output_tokens - req.num_generated_tokens
    return accepted + 1 if accepted + 1 < left else left


def rewind(pool, req, spec: Speculation) -> None:
    """After `verified`: SGLang and TensorRT-LLM give back the KV of the drafts the verification rejected,
    keeping the computed tokens and the lookahead slots the engine keeps (vLLM keeps all its blocks)."""
    pool.shrink(req, req.num_computed_tokens + spec.num_kept_lookahead_tokens)


def summary_keys(counters: SpecCounters) -> dict:
    """Results columns: spec-decode steps, mean accepted tokens per verification step (the acceptance
    length, bonus token included: vLLM's "mean acceptance length") and the draft acceptance rate
    (accepted / drafted, vLLM's `spec_decode_draft_acceptance_rate`)."""
    n = counters.num_verifications
    return {"spec_decode_steps": n,
            "spec_acceptance_length": (1.0 + counters.num_accepted_tokens / n) if n else float("nan"),
            "spec_draft_acceptance_rate": (counters.num_accepted_tokens / counters.num_draft_tokens
                                           if counters.num_draft_tokens else float("nan")),
            "spec_draft_tokens": counters.num_draft_tokens, "spec_accepted_tokens": counters.num_accepted_tokens}


def step_time_s(cost_model, spec: Speculation, prefill, decode, num_logits: int) -> float:
    """A step's time with speculation: the target's pass (verification rows are `(1 + drafts, context)`
    prefill-like rows: `split_shape` already puts them there; the LM head scores every draft position
    too, in `num_logits`) plus the proposer's drafting for the step's rows. The one formula both engines
    use (the same float operations in the same order)."""
    t = cost_model.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits)
    if spec.proposer is not None:
        t += spec.proposer.time_s(prefill, decode)
    return t


def num_logits(rows) -> int:
    """Positions the LM head scores in a step of `rows` (request record, new tokens): every verified
    position of a row that catches up (its drafts and the bonus), none for a partial prefill chunk."""
    n_logits = 0
    for req, n in rows:
        over = req.num_computed_tokens + n - req.spec.num_prompt_tokens - req.num_generated_tokens
        if over >= 0:
            n_logits += over + 1
    return n_logits
