"""What drafting costs in a speculative-decoding step (simcore/speculative.py's `Speculation.proposer`).

vLLM runs the drafter after the target's pass, for every request in the batch (vllm/v1/spec_decode/:
eagle.py, draft_model.py, ngram_proposer.py). A GPU drafter makes k passes, one after the other: the first
over every token the target just processed (it needs the target's hidden states at each, to write its own
KV), then k - 1 passes of one token per request. Each pass is priced by the roofline on the drafter's own
shapes (costmodels/roofline.py), without the per-step CPU terms (the passes run inside the target's step,
from one CUDA graph launch sequence). What the drafter is:

- eagle / eagle3: one decoder layer of the target's width (dense, the target's attention and MLP widths)
  plus the LM head (EAGLE, EAGLE-3 papers; vLLM's llama_eagle.py / llama_eagle3.py). EAGLE-3's input fusion
  (3 hidden states -> 1) and its smaller draft vocabulary are not priced apart: the LM head is the
  target's, an upper bound.
- mtp: the target's own MTP module, `num_nextn_predict_layers` (DeepSeek-V3: 1) layer of the target's kind
  (MoE, MLA) plus the shared LM head; vLLM reuses it for every draft position (deepseek_mtp.py).
- draft_model: the draft model's own config, every layer, with the target's tensor parallelism (vLLM's
  default `draft_tensor_parallel_size`).
- ngram: a CPU lookup per request per step, `NGRAM_CPU_S_PER_REQUEST`.

Whatever cost model prices the target, the drafter is priced by the roofline; the constant-cost stub
(exact tests) has none.
"""
from __future__ import annotations

import dataclasses

from costmodels.catalog import ModelShape
from costmodels.deployment import Deployment
from costmodels.roofline import Efficiencies, RooflineCostModel

# n-gram lookup on the CPU: vLLM's numba-compiled matcher (vllm/v1/spec_decode/ngram_proposer.py) took 1.9 s in
# all over a 5,000-request ShareGPT run (vLLM PR #13365, github.com/vllm-project/vllm/pull/13365), about a
# million request-steps at ShareGPT's ~200 output tokens a request: ~2 us per request per step. It runs on
# the CPU between the target's pass and the next step, so it adds to the step.
NGRAM_CPU_S_PER_REQUEST = 2.0e-6


def draft_shape(method: str, target: ModelShape, draft: ModelShape | None = None) -> ModelShape | None:
    """The drafter's shapes for a GPU method (None for ngram)."""
    if method == "ngram":
        return None
    if method == "draft_model":
        return draft
    if method == "mtp":   # one layer of the target's kind: MoE if the target's layers are
        return dataclasses.replace(target, name=f"{target.name}-mtp", num_layers=1,
                                   num_moe_layers=1 if target.num_moe_layers else 0, num_sliding_layers=0)
    # EAGLE heads: one dense Llama-style decoder layer of the target's width
    return dataclasses.replace(target, name=f"{target.name}-eagle-head", num_layers=1, num_experts=0,
                               experts_per_token=0, moe_intermediate_size=0, shared_expert_intermediate_size=0,
                               num_moe_layers=0, num_sliding_layers=0, sliding_window=None,
                               intermediate_size=target.intermediate_size or 4 * target.hidden_size)


class ProposerCost:
    """`time_s(prefill, decode)`: the drafting time of a step whose target rows are `prefill` ((new,
    cached) pairs) and `decode` (contexts), for `k` drafts."""

    def __init__(self, method: str, k: int, draft: RooflineCostModel | None):
        self.method, self.k, self.draft = method, k, draft

    def time_s(self, prefill, decode) -> float:
        num_seqs = len(prefill) + len(decode)
        if self.draft is None:
            return NGRAM_CPU_S_PER_REQUEST * num_seqs
        if num_seqs == 0:
            return 0.0
        draft = self.draft
        t = draft.step_time_s(prefill=prefill, decode=decode, num_logits=num_seqs)
        context_sum = sum(n + c for n, c in prefill) + sum(decode)
        for j in range(1, self.k):   # one token a request, each pass one position further
            t += draft.step_time_sums_s((), num_seqs, context_sum + j * num_seqs, num_seqs)
        return t

    def describe(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.k,
                "drafter": self.draft.model.name if self.draft is not None else "cpu n-gram lookup"}


def proposer_cost(method: str, k: int, target: ModelShape, gpu, deployment: Deployment | None,
                  draft: ModelShape | None = None, eff: Efficiencies = Efficiencies()) -> ProposerCost:
    """The drafter of `method` for `target` on `gpu`, laid out as the target (tensor parallelism, precision,
    experts), one pipeline stage."""
    shape = draft_shape(method, target, draft)
    if shape is None:
        return ProposerCost(method, k, None)
    d = dataclasses.replace(deployment or Deployment(), pipeline_parallel_size=1)
    gpu_only = dataclasses.replace(eff, per_step_s=0.0, per_request_s=0.0)
    return ProposerCost(method, k, RooflineCostModel(shape, gpu, eff=gpu_only, deployment=d))
