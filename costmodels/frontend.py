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
      frontend: {kind: http, fixed_ms: 4.8, per_1k_prompt_tokens_ms: 2.1}
    # or a kind alone: `frontend: http_chat`, `frontend: in_process`, `frontend: none`

A kind alone takes that kind's figures below; `fixed_ms` and `per_1k_prompt_tokens_ms` replace them.

The API server is also a resource: one Python process (one core, under the GIL) per engine replica admits
every request and streams every token, at the measured CPU per request and per chunk
(`api_server_cpu_per_request_ms`, `api_server_cpu_per_chunk_us`; `api_server_count`: processes per
replica, vLLM's `--api-server-count`). simcore/api_server.py queues each run's requests there: each waits
behind that work at admission and behind its step's other chunks for its first and last token, added to
its TTFT and E2E beside the figures above (`api_server_wait_mean_ms` in the results), and `api_server_busy`
is the share of the server's time that work takes. The engine itself is not held back by that queue, so a
run that would keep the server busy most of the time says so in words (simcore/metrics.py
`untrusted_notes`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("http", "http_chat", "in_process", "none")
KEYS = ("kind", "fixed_ms", "per_1k_prompt_tokens_ms", "api_server_cpu_per_request_ms", "api_server_cpu_per_chunk_us",
        "api_server_count")


@dataclass(frozen=True)
class FrontendLatency:
    """Seconds a request spends in the serving front end, outside the engine's steps."""
    fixed_s: float
    per_prompt_token_s: float = 0.0
    kind: str = "http"
    # the API server's own CPU time per request admitted and per streamed chunk (0: not known, no check)
    cpu_per_request_s: float = 0.0
    cpu_per_chunk_s: float = 0.0
    api_servers: int = 1   # API-server processes per engine replica

    def __post_init__(self):
        for name in ("fixed_s", "per_prompt_token_s", "cpu_per_request_s", "cpu_per_chunk_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"FrontendLatency.{name}: must be a non-negative number, not {v!r}")
        if isinstance(self.api_servers, bool) or not isinstance(self.api_servers, int) or self.api_servers < 1:
            raise ValueError(f"FrontendLatency.api_servers: must be an integer >= 1, not {self.api_servers!r}")
        if self.kind not in KINDS + ("fitted",):
            raise ValueError(f"FrontendLatency.kind: expected one of {', '.join(KINDS)}, not {self.kind!r}")

    def latency_s(self, prompt_tokens):
        """Seconds for a prompt of `prompt_tokens` (a number or a numpy array of them)."""
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens

    @property
    def is_zero(self) -> bool:
        return self.fixed_s == 0 and self.per_prompt_token_s == 0

    @property
    def has_server_cpu(self) -> bool:
        """Whether the API server's CPU per request and per chunk are known (so its load can be checked)."""
        return self.cpu_per_request_s > 0 or self.cpu_per_chunk_s > 0

    def describe(self) -> dict:
        out = {"kind": self.kind, "fixed_ms": round(self.fixed_s * 1e3, 6),
               "per_1k_prompt_tokens_ms": round(self.per_prompt_token_s * 1e6, 6)}
        if self.has_server_cpu:
            out.update(api_server_cpu_per_request_ms=round(self.cpu_per_request_s * 1e3, 6),
                       api_server_cpu_per_chunk_us=round(self.cpu_per_chunk_s * 1e6, 6),
                       api_server_count=self.api_servers)
        return out


# In-process (AsyncLLM, prompt token ids): 2.3 ms a request, measured on real vLLM 0.32 through AsyncLLM on
# this project's CPU machine (docs/fidelity/vllm-cpu/report.md: fidelity.fit_engine fitted 2.27 and 2.35 ms). No
# per-token term: no tokeniser runs, and the token ids' hand-off to the engine core is a small share of it.
IN_PROCESS = FrontendLatency(fixed_s=2.3e-3, per_prompt_token_s=0.0, kind="in_process")

# HTTP (`vllm serve`, streaming): the wall time a request spends outside the engine core's queue and steps,
# measured by benchmarks.frontend_latency on vLLM 0.32's CPU build with a 32k-entry byte-level BPE tokenizer,
# one request at a time, prompts of 100 to 8,000 tokens, 15 rounds (docs/fidelity/frontend.md): the client's
# TTFT minus the engine core's own queue and prefill time for that request (the server's /metrics
# histograms, engine-core timestamps), so the engine's speed on a shared machine drops out. What is left is
# the HTTP request's parsing and validation (FastAPI, pydantic), the prompt's tokenisation, the input
# processing and the hand-offs to and from the engine core, and the first SSE chunk's formatting and
# sending. Least squares over the per-length means:
# - `http` (/v1/completions with a text prompt, `vllm bench serve`'s default client): 4.8 ms + 2.1 ms per 1k
#   prompt tokens, of which the tokenizer alone takes 1.5 ms per 1k (transformers' fast tokenizer, as the
#   server loads it).
# - `http_chat` (/v1/chat/completions, one user message): 5.1 ms + 2.2 ms per 1k (the messages and the chat
#   template on top).
# The same split of the in-process client gives 2.2 ms + 0.1 per 1k, what `IN_PROCESS` has from whole runs.
# Host-CPU work, so it carries to a GPU server as far as its host CPU's single-core speed matches this one's
# (a virtualised Intel Xeon): an assumption, not a measurement on a GPU host.
#
# The API server's CPU under concurrent load, measured by benchmarks.frontend_load on the same server
# (docs/fidelity/frontend.md, "Under concurrent load": bursts of 50-200 streams, the API-server process's
# on-CPU time, least squares over 12 bursts a way): /v1/completions 1.20 ms a request and 60 us a streamed
# chunk, /v1/chat/completions 1.32 ms and 59 us. One process runs them on one core, so they bound what it
# serves: about 830 short requests or 17,000 streamed tokens a second. Less than a lone request's latency
# above: concurrent requests share the event loop's turns and the output thread's hand-offs.
HTTP = FrontendLatency(fixed_s=4.8e-3, per_prompt_token_s=2.1e-6, kind="http",
                       cpu_per_request_s=1.20e-3, cpu_per_chunk_s=60e-6)
HTTP_CHAT = FrontendLatency(fixed_s=5.1e-3, per_prompt_token_s=2.2e-6, kind="http_chat",
                            cpu_per_request_s=1.32e-3, cpu_per_chunk_s=59e-6)

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
    for k, scale in (("fixed_ms", 1e-3), ("per_1k_prompt_tokens_ms", 1e-6), ("api_server_cpu_per_request_ms", 1e-3),
                     ("api_server_cpu_per_chunk_us", 1e-6)):
        if k not in spec:
            continue
        v = spec[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}.{k}: expected a number of milliseconds, got {v!r}")
        if v < 0:
            raise ValueError(f"{where}.{k}: must be non-negative, got {v!r}")
        values[k] = float(v) * scale
    servers = spec.get("api_server_count", base.api_servers)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"{where}.api_server_count: expected an integer >= 1, got {servers!r}")
    return FrontendLatency(fixed_s=values.get("fixed_ms", base.fixed_s),
                           per_prompt_token_s=values.get("per_1k_prompt_tokens_ms", base.per_prompt_token_s),
                           kind=kind,
                           cpu_per_request_s=values.get("api_server_cpu_per_request_ms", base.cpu_per_request_s),
                           cpu_per_chunk_s=values.get("api_server_cpu_per_chunk_us", base.cpu_per_chunk_s),
                           api_servers=servers)


def frontend_of(cost_model) -> FrontendLatency:
    """The front end a cost model carries: its own `frontend`, or a fitted model's fixed
    `request_latency_s` (a step model fitted on real runs keeps the value it was fitted to), or none."""
    fe = getattr(cost_model, "frontend", None)
    if isinstance(fe, FrontendLatency):
        return fe
    lat = float(getattr(cost_model, "request_latency_s", 0.0) or 0.0)
    return FrontendLatency(fixed_s=lat, kind="fitted") if lat > 0 else NONE
