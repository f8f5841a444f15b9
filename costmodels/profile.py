"""Measured cost profile: per kernel family, log-latency on a grid of log-sizes fitted to real kernel timings
(calibration.fit); a step is the sum of the kernels one forward pass launches, plus explicit CPU overheads.

Between knots it interpolates multilinearly in (log size, log time); beyond the last knot it follows the
family's physical exponent (time ~ tokens for GEMMs, ~ length^2 for prefill attention, ~ context for decode
attention). It ignores kernel overlap and the interaction between concurrent kernels; the per-step and
per-request overheads (explicit fields, refittable against engine traces) absorb what kernel sums miss.
"""
from __future__ import annotations

import functools
import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from costmodels.attention_kernel import PrefillTileFit
from costmodels.catalog import DTYPE_BYTES, GPU, CatalogError, ModelShape, get_gpu
from costmodels.collectives import gpu_allreduce_link, logits_gather_s, ring_allreduce_s
from costmodels.frontend import HTTP as HTTP_FRONTEND, FrontendLatency
from costmodels.gridslice import GridSlice

FORMAT = "batchsim-profile/1"
GEMM_OPS = ("qkv", "o", "gate_up", "down")          # per layer, in forward order
ELEMENTWISE_PER_LAYER = {"rmsnorm": 2, "rotary": 1, "silu_mul": 1, "residual_add": 2}
ELEMENTWISE_PER_STEP = {"embedding": 1, "rmsnorm": 1}  # token embedding lookup, final norm
TABLE_BLOCK = 1024   # token counts priced per vectorised lookup (a few ms; one count alone costs ~40 us)


def gemm_shapes(model: ModelShape, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(N, K) of every GEMM of one forward pass on one of `tp` GPUs (column/row-parallel shards)."""
    m, hd = model, model.head_dim
    q = m.num_heads * hd // tp
    kv = 2 * max(1, m.num_kv_heads // tp) * hd
    mlp_in = (2 if m.gated_mlp else 1) * m.intermediate_size // tp
    return {"qkv": (q + kv, m.hidden_size), "o": (m.hidden_size, q), "gate_up": (mlp_in, m.hidden_size),
            "down": (m.hidden_size, m.intermediate_size // tp), "lm_head": (m.vocab_size // tp, m.hidden_size)}


def attention_heads(model: ModelShape, tp: int = 1) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) on one of `tp` GPUs."""
    return model.num_heads // tp, max(1, model.num_kv_heads // tp), model.head_dim


def prefill_coords(new_tokens: Sequence[float], cached_tokens: Sequence[float]) -> tuple[float, float]:
    """A varlen prefill batch as (number of sequences, equivalent length L): B sequences of L new tokens
    without cache do the same causal attention work sum(new * (cached + (new + 1) / 2))."""
    if len(new_tokens) == 1:   # one sequence, most prefill steps: the same operations without the generator
        n, c = new_tokens[0], cached_tokens[0]
        return 1.0, (math.sqrt(1.0 + 8.0 * (n * (c + (n + 1) / 2.0)) / 1.0) - 1.0) / 2.0
    work = sum(n * (c + (n + 1) / 2.0) for n, c in zip(new_tokens, cached_tokens))
    b = float(len(new_tokens))
    return b, (math.sqrt(1.0 + 8.0 * work / b) - 1.0) / 2.0


def decode_coords(context_lens: Sequence[float]) -> tuple[float, float]:
    """A decode batch as (batch size, mean context): decode attention streams every sequence's KV once."""
    return float(len(context_lens)), sum(context_lens) / len(context_lens)


@dataclass(frozen=True, eq=False)  # holds arrays: identity, not value, equality
class LogGrid:
    """log(latency_s) on a tensor grid of log(sizes). `slopes[i]` is the exponent beyond the last knot of
    axis i (physical extrapolation); below the first knot latency stays at the launch-bound floor."""
    axes: tuple[str, ...]
    log_knots: tuple[np.ndarray, ...]
    log_s: np.ndarray
    slopes: tuple[float, ...]

    @classmethod
    def from_dict(cls, d: dict) -> "LogGrid":
        knots = tuple(np.log(np.asarray(k, dtype=float)) for k in d["knots"])
        values = np.log(np.asarray(d["latency_s"], dtype=float))
        if values.shape != tuple(len(k) for k in knots) or not all(np.all(np.diff(k) > 0) for k in knots):
            raise ValueError(f"grid over {d['axes']}: latency_s shape {values.shape} does not match knots")
        return cls(tuple(d["axes"]), knots, values, tuple(float(s) for s in d["slopes"]))

    def to_dict(self) -> dict:
        return {"axes": list(self.axes), "slopes": list(self.slopes),
                "knots": [np.round(np.exp(k), 6).tolist() for k in self.log_knots],
                "latency_s": _round_sig(np.exp(self.log_s)).tolist()}

    def __post_init__(self):
        # Plain Python floats: a step evaluates a handful of grids, and numpy scalars are slow one by one.
        object.__setattr__(self, "_knots", [[float(v) for v in k] for k in self.log_knots])
        object.__setattr__(self, "_flat", [float(v) for v in np.ravel(self.log_s)])
        strides, stride = [], 1
        for k in reversed(self.log_knots):
            strides.append(stride)
            stride *= len(k)
        object.__setattr__(self, "_strides", strides[::-1])

    def __call__(self, *sizes: float) -> float:
        """Latency in seconds at `sizes` (one per axis, in the axes' raw units)."""
        if len(sizes) == 2:
            return self._call_2d(*sizes)
        return self._call_any(*sizes)

    def _cell(self, axis: int, x_raw: float) -> tuple[int, int, float, float]:
        """(flat offset of the lower knot, stride to the upper one or 0, weight of the upper one, log-time
        added beyond the last knot) along one axis."""
        k, stride = self._knots[axis], self._strides[axis]
        x = math.log(max(x_raw, 1e-12))
        if x >= k[-1]:
            return (len(k) - 1) * stride, 0, 0.0, self.slopes[axis] * (x - k[-1])
        if x <= k[0]:
            return 0, 0, 0.0, 0.0
        i = bisect_right(k, x) - 1
        return i * stride, stride, (x - k[i]) / (k[i + 1] - k[i]), 0.0

    def _call_2d(self, a: float, b: float) -> float:
        """`_call_any` for two axes, unrolled (prefill and decode attention, priced every step): the same
        operations in the same order, so the same bits (tests/test_profile_vectorised.py)."""
        b0, s0, t0, e0 = self._cell(0, a)
        b1, s1, t1, e1 = self._cell(1, b)
        extra = 0.0
        if e0:
            extra += e0
        if e1:
            extra += e1
        f0, f1, flat = 1.0 - t0, 1.0 - t1, self._flat
        value = 0.0
        w = f0 * f1   # the four corners in the general loop's order, without building tuples
        if w:
            value += w * flat[b0 + b1]
        w = t0 * f1
        if w:
            value += w * flat[b0 + s0 + b1]
        w = f0 * t1
        if w:
            value += w * flat[b0 + b1 + s1]
        w = t0 * t1
        if w:
            value += w * flat[b0 + s0 + b1 + s1]
        return math.exp(value + extra)

    def _call_any(self, *sizes: float) -> float:
        cells, extra = [], 0.0
        for axis, x_raw in enumerate(sizes):
            base, step, t, beyond = self._cell(axis, x_raw)
            extra += beyond   # 0.0 inside the grid: adding it changes no bit
            cells.append((base, step, t))
        value = 0.0
        for corner in range(1 << len(cells)):  # multilinear: 2^d corners (d <= 3)
            index, w = 0, 1.0
            for axis, (base, step, t) in enumerate(cells):
                if (corner >> axis) & 1:
                    index, w = index + base + step, w * t
                else:
                    index, w = index + base, w * (1.0 - t)
            if w:
                value += w * self._flat[index]
        return math.exp(value + extra)


def _round_sig(x: np.ndarray, digits: int = 4) -> np.ndarray:
    """Round to significant digits (a monotone map, so monotone grids stay monotone)."""
    exponent = np.floor(np.log10(np.abs(x)))
    scale = 10.0 ** (digits - 1 - exponent)
    return np.round(x * scale) / scale


@dataclass(frozen=True)
class Overheads:
    """CPU-side time a real engine adds to the kernels of a step (scheduling, input preparation, sampling
    bookkeeping, detokenisation) and per-layer launch gaps; fitted from whole-iteration timings when the
    profile has them, else the roofline prior's figures. Explicit fields, so that a fit against real
    engine traces can replace them without touching the kernel families."""
    per_step_s: float
    per_request_s: float
    per_layer_s: float = 0.0
    source: str = "roofline prior"


class ProfileCostModel:
    """`step_time_s(prefill=[(new, cached), ...], decode=[context, ...])` from a measured profile for
    one replica of `model` on `tp` GPUs of kind `gpu`. Same protocol as RooflineCostModel; seconds."""

    # The serving front end's time per request, outside the steps the kernel timings price (tokenisation,
    # HTTP, IPC, streaming: costmodels/frontend.py): an engine's cost, not a kernel's, so no kernel timing
    # measures it. The same default as the roofline prior's: clients reach vLLM through `vllm serve`, as
    # `vllm bench serve` does. Leaving it out would also let each closed-loop user's next request reach the
    # scheduler exactly at a step boundary, never mid-step, and understate TTFT by up to a step.
    frontend: FrontendLatency = HTTP_FRONTEND

    def __init__(self, profile: dict, model: ModelShape, gpu: GPU | None, tp: int = 1, dtype: str = "bf16",
                 source: str = "<dict>"):
        """`gpu`: the simulated hardware (its interconnect prices TP all-reduces); None only for tp=1."""
        self.model, self.gpu, self.tp, self.dtype, self.source = model, gpu, tp, dtype, source
        self.profile = profile
        # The engine a profile's kernels serve here is vLLM V1 on a GPU, whose async scheduling (on by
        # default on CUDA since 0.14) makes a request that arrives mid-step wait one step more
        # (simcore/async_scheduling.py); a profile file may say otherwise (`"async_scheduling": false`).
        self.async_scheduling = bool(profile.get("async_scheduling", gpu is not None))
        fam = profile["families"]
        self.gemm = {op: LogGrid.from_dict(fam[f"gemm_{op}"]) for op in (*GEMM_OPS, "lm_head")}
        # Prefill attention: FlashAttention's tiles as fitted on the profile's GPU (calibration/prefill_tiles.py)
        # where the profile has them, else the grid over sequences x equivalent length.
        self.prefill_tiles = PrefillTileFit.from_dict(fam["prefill_attn_tiles"]) if "prefill_attn_tiles" in fam else None
        self.prefill_attn = LogGrid.from_dict(fam["prefill_attn"]) if self.prefill_tiles is None else None
        self._heads = attention_heads(model, tp)[:2]
        self.decode_attn = LogGrid.from_dict(fam["decode_attn"])
        # What a step mixing prefill chunks with decodes adds to its two attention parts, per layer, over
        # (decodes, mean decode context, prefill tokens), where the profile measured it (vLLM's one varlen
        # kernel over both: on FlashAttention 2 the decodes lose their grouped-query fold,
        # costmodels/attention_kernel.py); absent: the parts alone.
        self.mixed_attn = LogGrid.from_dict(fam["mixed_attn"]) if "mixed_attn" in fam else None
        self.elementwise = {op: LogGrid.from_dict(g) for op, g in fam["elementwise"].items()}
        self.sampling = LogGrid.from_dict(fam["sampling"])
        o = profile["overheads"]
        self.overheads = Overheads(float(o["per_step_s"]), float(o["per_request_s"]),
                                   float(o.get("per_layer_s", 0.0)), str(o.get("source", "?")))
        # Tables and memos of pure functions of counts: a run prices millions of steps from a few thousand
        # distinct token counts and batch sizes. Per-token-count terms are priced TABLE_BLOCK counts at a
        # time (one vectorised lookup per grid, bitwise equal to the scalar formulas in `_dense_layer_s`
        # and `_step_terms_scalar_s`), so a fresh model (one per simulation of a search) warms up fast.
        self._blocks: dict[tuple[str, int], list[float]] = {}
        self._decode_slices: dict[int, GridSlice] = {}
        self._prefill_slices: dict[float, GridSlice] = {}
        # A subclass that prices its layers its own way (its `_dense_layer_s`) is memoised count by count.
        self._dense_by_table = type(self)._dense_layer_s is ProfileCostModel._dense_layer_s
        self._dense_memo: dict[int, float] = {}

    def describe(self) -> dict:
        p = self.profile
        return {"kind": "profile", "name": p.get("name", "?"), "source": self.source,
                "gpu": self.gpu.name if self.gpu else p["gpu"], "measured_on": p["gpu"],
                "model": self.model.name, "tp": self.tp, "dtype": self.dtype,
                "provenance": p.get("provenance", {}), "held_out_error": p.get("fit_report", {}),
                "family_sources": p.get("family_sources", {}),
                "overheads": {"per_step_s": self.overheads.per_step_s,
                              "per_request_s": self.overheads.per_request_s,
                              "per_layer_s": self.overheads.per_layer_s, "source": self.overheads.source},
                "frontend": self.frontend.describe()}

    def dense_layer_s(self, num_tokens: int) -> float:
        """GEMMs, elementwise work and TP all-reduces of one layer: depend on the token count only."""
        if self._dense_by_table:
            return self._by_count("dense", self._dense_layer_block, num_tokens)
        t = self._dense_memo.get(num_tokens)
        if t is None:
            t = self._dense_memo[num_tokens] = self._dense_layer_s(num_tokens)
        return t

    def _by_count(self, name: str, build, n: int) -> float:
        block, i = divmod(n, TABLE_BLOCK)
        table = self._blocks.get((name, block))
        if table is None:
            counts = np.arange(block * TABLE_BLOCK, (block + 1) * TABLE_BLOCK, dtype=float)
            table = self._blocks[(name, block)] = build(counts).tolist()
        return table[i]

    def _dense_layer_block(self, m: np.ndarray) -> np.ndarray:
        """`_dense_layer_s` at every count in `m`: the same sums in the same order, elementwise."""
        t = sum(GridSlice(self.gemm[op], ()).many(m) for op in GEMM_OPS)
        t += sum(n * GridSlice(self.elementwise[op], ()).many(m) for op, n in ELEMENTWISE_PER_LAYER.items())
        allreduce = np.array([self._allreduce_s(int(x)) for x in m.tolist()]) if self.tp > 1 else 0.0
        return t + allreduce + self.overheads.per_layer_s

    def _dense_layer_s(self, num_tokens: int) -> float:
        """`dense_layer_s` one count at a time (the reference the tables are tested against)."""
        t = sum(self.gemm[op](num_tokens) for op in GEMM_OPS)
        t += sum(n * self.elementwise[op](num_tokens) for op, n in ELEMENTWISE_PER_LAYER.items())
        return t + self._allreduce_s(num_tokens) + self.overheads.per_layer_s

    @functools.cached_property
    def tp_link(self):
        """What the TP all-reduce crosses (costmodels/collectives.py), derived once from the GPU and TP size."""
        return gpu_allreduce_link(self.gpu, self.tp)

    def _allreduce_s(self, num_tokens: int) -> float:
        """Two all-reduces per layer under TP; not in the kernel tables, so the roofline prior's terms for
        what they cross (costmodels/collectives.py)."""
        if self.tp == 1:
            return 0.0
        message = num_tokens * self.model.hidden_size * DTYPE_BYTES[self.dtype]
        return 2 * ring_allreduce_s(message, self.tp, self.gpu.interconnect_bytes_per_s, self.tp_link)

    def step_time_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                    num_logits: int | None = None) -> float:
        return self.step_time_sums_s(prefill, len(decode), sum(decode), num_logits)

    def step_time_sums_s(self, prefill: Sequence[tuple[int, int]], num_decode: int, decode_context_sum,
                         num_logits: int | None = None) -> float:
        """`step_time_s` from the count and the sum of the decode contexts, all decode attention depends
        on (`decode_coords`); the fast path (simcore/fast/engine.py) prices with it."""
        new = [n for n, _ in prefill]
        num_seqs = len(new) + num_decode
        num_tokens = sum(new) + num_decode
        if num_tokens == 0:
            return 0.0
        if num_logits is None:
            num_logits = num_seqs
        layer = self.dense_layer_s(num_tokens)
        if new:
            layer += self.prefill_layer_s(prefill)
        if num_decode:
            layer += self._decode_slice(num_decode).scalar(decode_context_sum / num_decode)  # decode_coords
            if new and self.mixed_attn is not None:
                layer += self.mixed_attn(num_decode, decode_context_sum / num_decode, sum(new))
        o = self.overheads
        return (self.model.num_layers * layer + self._step_terms_s(num_tokens, num_logits) + o.per_step_s
                + o.per_request_s * num_seqs)

    def _step_terms_s(self, num_tokens: int, num_logits: int) -> float:
        """Once per step: embedding and final norm, LM head and sampling."""
        step = self._by_count("per_step", self._per_step_block, num_tokens)
        if num_logits:
            step += self._by_count("logits", self._logits_block, num_logits)
        return step

    def _per_step_block(self, m: np.ndarray) -> np.ndarray:
        return sum(n * GridSlice(self.elementwise[op], ()).many(m) for op, n in ELEMENTWISE_PER_STEP.items())

    def _logits_block(self, m: np.ndarray) -> np.ndarray:
        t = GridSlice(self.gemm["lm_head"], ()).many(m) + GridSlice(self.sampling, ()).many(m)
        return t + np.array([self._logits_gather_s(int(x)) for x in m.tolist()]) if self.tp > 1 else t

    def _logits_gather_s(self, num_logits: int) -> float:
        """The all-gather of the LM head's vocabulary shards under TP: not in the kernel tables, so the
        roofline prior's term (collectives.logits_gather_s)."""
        return logits_gather_s(num_logits, self.model.vocab_size, self.tp, DTYPE_BYTES[self.dtype], self.gpu)

    def _step_terms_scalar_s(self, num_tokens: int, num_logits: int) -> float:
        """`_step_terms_s` one count at a time (the reference the tables are tested against)."""
        step = sum(n * self.elementwise[op](num_tokens) for op, n in ELEMENTWISE_PER_STEP.items())
        if num_logits:
            step += self.gemm["lm_head"](num_logits) + self.sampling(num_logits) + self._logits_gather_s(num_logits)
        return step

    def prefill_layer_s(self, prefill: Sequence[tuple[int, int]]) -> float:
        """One layer's prefill attention over (new tokens, cached tokens) chunks."""
        if self.prefill_tiles is not None:
            return self.prefill_tiles.layer_s(prefill, *self._heads)
        b, length = prefill_coords([n for n, _ in prefill], [c for _, c in prefill])
        return self._prefill_slice(b).scalar(length)   # self.prefill_attn(b, length), bitwise

    def _prefill_slice(self, num_seqs: float) -> GridSlice:
        """The prefill-attention grid at `num_seqs` sequences (its first axis), a function of the equivalent
        length; equal, bitwise, to `self.prefill_attn(num_seqs, length)` (one lookup fewer a step)."""
        s = self._prefill_slices.get(num_seqs)
        if s is None:
            s = self._prefill_slices[num_seqs] = GridSlice(self.prefill_attn, (num_seqs,))
        return s

    def _decode_slice(self, num_decode: int) -> GridSlice:
        """The decode-attention grid at a batch of `num_decode` (its first axis), a function of the mean
        context; equal, bitwise, to `self.decode_attn(float(num_decode), mean_context)`."""
        s = self._decode_slices.get(num_decode)
        if s is None:
            s = self._decode_slices[num_decode] = GridSlice(self.decode_attn, (float(num_decode),))
        return s

    def decode_step_time_fn(self, num_seqs: int, num_logits: int | None = None):
        """A function of the decode context sum equal to `step_time_sums_s((), num_seqs, sum, num_logits)`,
        with the terms that depend on the counts only evaluated once."""
        num_logits = num_seqs if num_logits is None else num_logits
        dense, step = self.dense_layer_s(num_seqs), self._step_terms_s(num_seqs, num_logits)
        per_step_s, per_seqs_s = self.overheads.per_step_s, self.overheads.per_request_s * num_seqs
        decode_attn, num_layers = self._decode_slice(num_seqs).scalar, self.model.num_layers

        def step_time_s(context_sum) -> float:
            layer = dense + decode_attn(context_sum / num_seqs)
            return num_layers * layer + step + per_step_s + per_seqs_s
        return step_time_s

    def decode_steps_time_s(self, num_seqs: int, context_sums, num_logits: int | None = None) -> np.ndarray:
        """Many decode-only steps of `num_seqs` sequences at once (step i's contexts sum to
        `context_sums[i]`): element i equals `decode_step_time_fn(num_seqs, num_logits)(context_sums[i])`,
        bitwise (the same operations, elementwise), so the fast path prices long stretches in one call."""
        num_logits = num_seqs if num_logits is None else num_logits
        dense, step = self.dense_layer_s(num_seqs), self._step_terms_s(num_seqs, num_logits)
        per_step_s, per_seqs_s = self.overheads.per_step_s, self.overheads.per_request_s * num_seqs
        layer = dense + self._decode_slice(num_seqs).many(np.asarray(context_sums) / num_seqs)
        return self.model.num_layers * layer + step + per_step_s + per_seqs_s


def read_profile(path: Path) -> dict:
    """Parse and validate a profile file; any problem is a one-line CatalogError naming the file."""
    try:
        profile = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such profile file") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: not a valid profile JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise CatalogError(f"{path}: not a batchsim profile (expected \"format\": \"{FORMAT}\")")
    for key in ("model", "gpu", "tp", "dtype", "families", "overheads"):
        if key not in profile:
            raise CatalogError(f"{path}: profile lacks required key {key!r}")
    return profile


def profile_cost_model(profile: dict, model: ModelShape, gpu: GPU | None = None, tp: int | None = None,
                       dtype: str | None = None, source: str = "<dict>", deployment=None) -> ProfileCostModel:
    """Build the cost model, checking the profile was measured for this model's shapes, TP and dtype.
    MoE and MLA models, fp8 weights (`deployment`) and measured all-reduces are priced by
    costmodels.profile_families."""
    tp = profile["tp"] if tp is None else tp
    dtype = profile["dtype"] if dtype is None else dtype
    if (profile["tp"], profile["dtype"]) != (tp, dtype):
        raise CatalogError(f"{source}: profile is for tp={profile['tp']} {profile['dtype']}, "
                           f"the simulation asks tp={tp} {dtype}")
    want = {op: list(s) for op, s in gemm_shapes(model, tp).items()}
    have = profile.get("shapes", {}).get("gemm", want)
    if have != want:
        raise CatalogError(f"{source}: profile was fitted for {profile['model']} GEMM shapes {have}, "
                           f"not {model.name}'s {want}")
    from costmodels.profile_families import FamilyProfileCostModel, needs_family_pricing
    try:
        key = (json.dumps(profile, sort_keys=True, default=str), model, gpu, tp, dtype, source, deployment)
        shared = _BUILT.get(key)
    except TypeError:   # an unhashable model, GPU or deployment description: build afresh
        key = shared = None
    if shared is not None:
        return shared
    try:
        gpu = gpu or get_gpu(profile["gpu"]) if tp > 1 else gpu
        if needs_family_pricing(profile, model, deployment):   # MoE/MLA/fp8/measured all-reduce
            built = FamilyProfileCostModel(profile, model, gpu, tp, dtype, source, deployment)
        else:
            built = ProfileCostModel(profile, model, gpu, tp, dtype, source)
    except CatalogError:   # a refusal that already names the profile and the reason
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogError(f"{source}: malformed profile ({type(e).__name__}: {e})") from None
    if key is not None:
        if len(_BUILT) >= 8:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = built
    return built


# The last few models built, by their profile's content and settings: a model is a pure function (its
# tables and memos are caches), so the simulations of one search or sweep in a process share one and its
# warm tables instead of re-pricing every token count per simulation.
_BUILT: dict[tuple, ProfileCostModel] = {}
