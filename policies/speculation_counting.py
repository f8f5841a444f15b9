"""How SGLang and TensorRT-LLM count a speculating request's tokens and KV (docs/speculative.md, "Per
engine"); vLLM V1's counting is `policies/chunked_prefill.py` `spec_row`. A decoding request carries
`num_spec_tokens` drafts (k; simcore/speculative.py) and verifies 1 + k tokens a step in every engine.

- SGLang (`Scheduler.update_running_batch`, `ScheduleBatch.check_decode_mem`): before a decode step every
  running request needs room for `decode_mem_cache_buf_multiplier` = speculative_num_draft_tokens +
  speculative_eagle_topk x speculative_num_steps tokens (the verification's 1 + k, and the draft tree's
  slots, `view.num_lookahead_tokens`); with fewer free, requests are retracted. No token budget bounds a
  decode step.
- TensorRT-LLM (`microBatchScheduler.cpp`, `KVCacheManager.prepare_resources`): a generation request takes
  1 + k tokens of `max_num_tokens` (`reqNumTokens = reqBeamWidth + llmReq->getNumDraftTokens()`) and KV for
  them past its held tokens, which include `num_extra_kv_tokens` (`view.num_lookahead_tokens`) added when
  its context started.
"""
from __future__ import annotations

from simcore.request import Request
from simcore.view import EngineView


def sglang_decode_room(view: EngineView) -> int:
    """Tokens past its computed ones a decoding request must have room for before an SGLang decode step:
    one without speculation, 1 + k + the draft tree's slots with it."""
    k = view.num_speculative_tokens
    return 1 + k + view.num_lookahead_tokens if k else 1


def trtllm_step_tokens(req: Request) -> int:
    """A TensorRT-LLM generation request's tokens this step: its next token and its drafts."""
    return 1 + req.num_spec_tokens


def trtllm_held_tokens(view: EngineView, req: Request, num_new_tokens: int) -> int:
    """KV tokens a running TensorRT-LLM request holds through a step of `num_new_tokens`: those computed,
    the step's, and the one-model drafter's extra slots (none without speculation)."""
    return req.num_computed_tokens + num_new_tokens + view.num_lookahead_tokens


def trtllm_reservation_slack(view: EngineView) -> int:
    """KV tokens past prompt + max output that GUARANTEED_NO_EVICT reserves for a speculating request: the
    extra slots and the drafts of its last verification, which may run past its last token (TensorRT-LLM's
    count to completion, `getRemainingBlocksToCompletion`, leaves them out; here the pool must hold them)."""
    return view.num_lookahead_tokens + view.num_speculative_tokens
