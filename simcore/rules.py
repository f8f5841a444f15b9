"""Engine rules both engines share (simcore/engine.py, simcore/fast/engine.py): pure functions over request
records, so that a rule about rejecting, sampling or leaving the queue is written once."""
from __future__ import annotations

from collections import deque

from simcore.kvcache import cdiv
from simcore.request import Request, RequestSpec, Status


def reject_reason(spec: RequestSpec, policy, max_model_len: int, num_blocks: int, block_size: int,
                  kv_groups=None, speculation=None) -> str | None:
    """Why an engine refuses `spec` on arrival, or None. vLLM rejects prompt >= max_model_len, and
    prompt + max_tokens > max_model_len at the API server; a request whose peak KV (as the policy
    reserves it, drafts included when it speculates; over every group of vLLM's hybrid manager,
    `kv_groups`) never fits the pool would wait forever."""
    if spec.num_prompt_tokens + max(1, spec.num_output_tokens) > max_model_len:
        return "exceeds_max_model_len"
    if spec.num_output_tokens < 1 or spec.num_prompt_tokens < 1:
        return "empty_prompt_or_output"
    tokens = policy.kv_tokens_needed(spec, max_model_len)
    if speculation is not None and hasattr(policy, "speculation_reserve_tokens"):
        tokens += policy.speculation_reserve_tokens(speculation)
    if (cdiv(tokens, block_size) if kv_groups is None else kv_groups.blocks_per_request(tokens)) > num_blocks:
        return "exceeds_kv_capacity"
    return None


def is_decode(req: Request) -> bool:
    """A request computing one token of a sequence whose prompt is done: priced and counted as a decode."""
    return req.num_tokens - req.num_computed_tokens == 1 and req.num_generated_tokens > 0


def samples(req: Request, num_new_tokens: int) -> bool:
    """Whether computing `num_new_tokens` more tokens catches `req` up, so that it samples a token."""
    return req.num_computed_tokens + num_new_tokens >= req.num_tokens


def without_admitted(waiting: deque, num_admitted: int) -> deque:
    """`waiting` less the requests just admitted (now RUNNING). FCFS policies admit from the front: those
    are popped without scanning; a policy that skipped the head (priority order) costs one pass."""
    num_front = 0
    while waiting and waiting[0].status is Status.RUNNING:
        waiting.popleft()
        num_front += 1
    if num_front < num_admitted:
        return deque(r for r in waiting if r.status is not Status.RUNNING)
    return waiting


def take_sample(req: Request, now_s: float, log, num_tokens: int = 1) -> bool:
    """`req` samples `num_tokens` tokens at `now_s` (its KV has caught up) in one streamed chunk (several:
    speculative decoding's accepted tokens, one ITL gap as `vllm bench serve` counts a chunk): count them,
    log its first token or the gap since its last chunk (`log.itl_gaps_s`), and say whether that was its
    last token. The SimPy and pipelined engines' rule; the fast engine inlines the same steps with gaps
    grouped by their start (simcore/fast/engine.py)."""
    req.num_generated_tokens += num_tokens
    if req.first_token_s is None:
        req.first_token_s = now_s
        log.event(now_s, req, "first_token")
    else:
        log.itl_gaps_s.append(now_s - req.last_token_s)
    req.last_token_s = now_s
    return req.num_generated_tokens == req.spec.num_output_tokens
