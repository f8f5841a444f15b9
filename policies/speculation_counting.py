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
- TGI (`backends/v3/src/queue.rs` `next_batch`, `server/text_generation_server/models/flash_causal_lm.py`):
  n-gram speculation only (Medusa and MLP-speculator heads are not among our methods). Admission reserves
  `input_length + max_new_tokens + speculate - 1` tokens at once (the last verification's drafts may run past
  the last token), so nothing is given back or preempted. The server keeps a batch's drafts
  (`speculative_ids`) only after a forward that left no request prefilling, and discards them all when a new
  batch is concatenated in (`concatenate`: only if every batch has them); with them, every request verifies
  1 + k tokens, with no token budget.
"""
from __future__ import annotations

from simcore.request import Request
from simcore.view import EngineView


def sglang_decode_room(view: EngineView) -> int:
    """Tokens past its computed ones a decoding request must have room for before an SGLang decode step:
    one without speculation, 1 + k + the draft tree's slots with it."""
    k = view.num_speculative_tokens
    return 1 + k + view.num_lookahead_tokens if k else 1


def verification_tokens(req: Request) -> int:
    """A decoding request's tokens in a step that verifies its drafts (TensorRT-LLM's generation request, a
    TGI decode in a forward with drafts): its next token and its k drafts."""
    return 1 + req.num_spec_tokens


def trtllm_held_tokens(view: EngineView, req: Request, num_new_tokens: int) -> int:
    """KV tokens a running TensorRT-LLM request holds through a step of `num_new_tokens`: those computed,
    the step's, and the one-model drafter's extra slots (none without speculation)."""
    return req.num_computed_tokens + num_new_tokens + view.num_lookahead_tokens


def trtllm_reservation_slack(drafts) -> int:
    """KV tokens past prompt + max output that GUARANTEED_NO_EVICT reserves for a speculating request: the
    extra slots and the drafts of its last verification, which may run past its last token (TensorRT-LLM's
    count to completion, `getRemainingBlocksToCompletion`, leaves them out; here the pool must hold them).
    `drafts`: the engine's view or the run's Speculation (both carry the two counts)."""
    return drafts.num_lookahead_tokens + drafts.num_speculative_tokens


def tgi_batch_has_drafts(view: EngineView) -> bool:
    """Whether TGI's running batch carries drafts into its next forward: the server sets `speculative_ids`
    after a forward only `if not prefill or (prefill and finished_prefilling)`, so not while any request is
    still prefilling (a chunked prompt). A forward that onboards new requests concatenates a batch without
    drafts, which drops everyone's: the caller gives that forward one token a decode."""
    if not view.num_speculative_tokens:
        return False
    return not any(r.num_uncomputed_tokens > 1 or r.num_generated_tokens == 0 for r in view.running)
