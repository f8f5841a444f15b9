"""The serving front end's time per request, outside the engine's steps: what a client's TTFT and E2E hold
beyond the scheduler and the forward passes.

`FrontendLatency(fixed_s, per_prompt_token_s)`: `latency_s(prompt_tokens) = fixed_s + per_prompt_token_s x
prompt_tokens`, added once to each request's TTFT and E2E (never to TPOT or ITL: it is paid before the first
token reaches the engine and around the stream's ends, not between tokens). The kinds, as a client
reaches vLLM:

  in_process  AsyncLLM.generate with prompt token ids (what fidelity.vllm_run drives): input processing
              before the scheduler sees the request, the engine-core IPC both ways, output processing.
  http        `vllm serve`'s OpenAI-compatible server in front of the same: the HTTP request's parsing and
              validation, the prompt's tokenisation (its time grows with the prompt: the per-token term),
              and the streamed (SSE) chunks back; plus everything in_process pays (/v1/completions).
  http_chat   the same through /v1/chat/completions: the chat template is rendered before tokenising.
  none        nothing outside the steps.

Sweep files override it under `engine.frontend` (experiments/engine_config.py):

    engine:
      frontend: {kind: http, fixed_ms: 9.0, per_1k_prompt_tokens_ms: 3.7}
    # or a kind alone: `frontend: http_chat`, `frontend: in_process`, `frontend: none`

A kind alone takes that kind's figures below; `fixed_ms` and `per_1k_prompt_tokens_ms` replace them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("http", "http_chat", "in_process", "none")
KEYS = ("kind", "fixed_ms", "per_1k_prompt_tokens_ms")


@dataclass(frozen=True)
class FrontendLatency:
    """Seconds a request spends in the serving front end, outside the engine's steps."""
    fixed_s: float
    per_prompt_token_s: float = 0.0
    kind: str = "http"

    def __post_init__(self):
        for name in ("fixed_s", "per_prompt_token_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"FrontendLatency.{name}: must be a non-negative number, not {v!r}")
        if self.kind not in KINDS + ("fitted",):
            raise ValueError(f"FrontendLatency.kind: expected one of {', '.join(KINDS)}, not {self.kind!r}")

    def latency_s(self, prompt_tokens):
        """Seconds for a prompt of `prompt_tokens` (a number or a numpy array of them)."""
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens

    @property
    def is_zero(self) -> bool:
        return self.fixed_s == 0 and self.per_prompt_token_s == 0

    def describe(self) -> dict:
        return {"kind": self.kind, "fixed_ms": round(self.fixed_s * 1e3, 6),
                "per_1k_prompt_tokens_ms": round(self.per_prompt_token_s * 1e6, 6)}


# In-process (AsyncLLM, prompt token ids): 2.3 ms a request, measured on real vLLM 0.32 through AsyncLLM on
# this project's CPU machine (docs/fidelity/vllm-cpu/report.md: fidelity.fit_engine fitted 2.27 and 2.35 ms). No
# per-token term: no tokeniser runs, and the token ids' hand-off to the engine core is a small share of it.
IN_PROCESS = FrontendLatency(fixed_s=2.3e-3, per_prompt_token_s=0.0, kind="in_process")

# HTTP (`vllm serve`, streaming): the in-process figure plus what the OpenAI-compatible server adds on top of
# it, measured by benchmarks.frontend_latency on vLLM 0.32's CPU build with a 32k-entry byte-level BPE
# tokenizer, prompts of 100 to 8,000 tokens (docs/fidelity/frontend.md). On a 2-core host shared with other
# work the client-side wall-clock difference was noise (quartiles hundreds of ms wide), so the figures are
# CPU time, the work an idle host's front end puts on the request's path:
# - fixed 6.7 ms: the server's on-CPU time per request minus the in-process client's, the intercept of its
#   line in the prompt's length (/v1/completions with a text prompt; a second run gave 8.1 ms). It is the
#   HTTP request's parsing and validation (FastAPI, pydantic) and the SSE chunks' formatting and sending;
#   the engine-core hand-off is in the in-process figure already.
# - 3.7 ms per 1k prompt tokens: the prompt's tokenisation alone (transformers' fast tokenizer, as the
#   server loads it; docs/fidelity/frontend/tokenize.csv). The server's own CPU time grew by 3.3 ms per 1k
#   in the first run and 9.3 in the second: it also burns CPU while a long prefill runs, so its slope is
#   not the front end's per-token work alone.
# `http` is /v1/completions with a text prompt (`vllm bench serve`'s default client); `http_chat` is
# /v1/chat/completions, whose fixed part is 11.8 ms (12.2 in the second run): the messages and the chat
# template on top. Both are host-CPU work, so they carry to a GPU server only as far as its host CPU's
# single-core speed matches this one's (a virtualised Intel Xeon): an assumption, not a measurement on a
# GPU host.
HTTP = FrontendLatency(fixed_s=IN_PROCESS.fixed_s + 6.7e-3, per_prompt_token_s=3.7e-6, kind="http")
HTTP_CHAT = FrontendLatency(fixed_s=IN_PROCESS.fixed_s + 11.8e-3, per_prompt_token_s=3.7e-6, kind="http_chat")

NONE = FrontendLatency(fixed_s=0.0, per_prompt_token_s=0.0, kind="none")
PRESETS = {"http": HTTP, "http_chat": HTTP_CHAT, "in_process": IN_PROCESS, "none": NONE}


def parse_frontend(spec, where: str = "engine.frontend") -> FrontendLatency:
    """`engine.frontend` from a sweep file: a kind name or a mapping of KEYS. A bad value is a ValueError
    whose one-line message names the key."""
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a kind ({', '.join(KINDS)}) or a mapping of "
                         f"{', '.join(KEYS)}, got {spec!r}")
    for k in spec:
        if k not in KEYS:
            raise ValueError(f"{where}.{k}: unknown key; expected {', '.join(KEYS)}")
    kind = spec.get("kind", "http")
    if kind not in KINDS:
        raise ValueError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    base = PRESETS[kind]
    values = {}
    for k, scale in (("fixed_ms", 1e-3), ("per_1k_prompt_tokens_ms", 1e-6)):
        if k not in spec:
            continue
        v = spec[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}.{k}: expected a number of milliseconds, got {v!r}")
        if v < 0:
            raise ValueError(f"{where}.{k}: must be non-negative, got {v!r}")
        values[k] = float(v) * scale
    return FrontendLatency(fixed_s=values.get("fixed_ms", base.fixed_s),
                           per_prompt_token_s=values.get("per_1k_prompt_tokens_ms", base.per_prompt_token_s),
                           kind=kind)


def frontend_of(cost_model) -> FrontendLatency:
    """The front end a cost model carries: its own `frontend`, or a fitted model's fixed
    `request_latency_s` (a step model fitted on real runs keeps the value it was fitted to), or none."""
    fe = getattr(cost_model, "frontend", None)
    if isinstance(fe, FrontendLatency):
        return fe
    lat = float(getattr(cost_model, "request_latency_s", 0.0) or 0.0)
    return FrontendLatency(fixed_s=lat, kind="fitted") if lat > 0 else NONE
