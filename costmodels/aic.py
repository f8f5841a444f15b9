"""A cost model built on demand from NVIDIA's measured kernel tables in the installed `aiconfigurator-core`
package (pip install -e '.[aic]'): the roofline prior's terms, with GEMMs, attention, routed experts and
TP all-reduces replaced by the tables' own timings for the model's shapes, GPU, framework and version.

Each family is a grid over the table's own knots with a held-out error (costmodels/tablegrid.py). MLA
layers use the tables' whole MLA block (DeepSeek-V3 shapes, projections included); EP dispatch/combine
use NCCL's all-to-all table. What the tables lack for this model (elementwise work, sampling, CPU
overheads, any family missing for these shapes) stays the roofline prior's; `describe()["family_sources"]`
says which is which. Built grids are cached as JSON under ~/.cache/batchsim/aic (or $BATCHSIM_CACHE).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from commandline.files import content_hash, write_json_atomic
from costmodels.catalog import GPU, CatalogError, ModelShape
from costmodels.deployment import WEIGHT_BYTES, Deployment
from costmodels.profile import prefill_coords
from costmodels.tablegrid import TableFamily, family, table_guard
from costmodels.roofline import RooflineCostModel

# Catalog GPUs whose tables aiconfigurator-core ships for vLLM (its h100_pcie and a100_pcie folders hold no vLLM
# tables; its RTX PRO 6000 tables are the 1,597 GB/s Server Edition's, not the Workstation Edition's).
GPU_DIRS = {"a100-80gb": "a100_sxm", "h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "b200-sxm": "b200_sxm",
            "gb200": "gb200", "l40s": "l40s", "l4": "l4", "rtx-pro-6000-server": "rtx_pro_6000_server"}
# GPUs whose tables price a run by default when the extra is installed (`profile: aic` reaches all of GPU_DIRS).
# Not the RTX PRO 6000 Server: on the only real serving runs on it we replay (vLLM 0.19, LLMServingSim's set;
# docs/fidelity/gpu/README.md) its tables (vLLM 0.24 kernels) price Llama-3.1-8B's decode 8% faster per token
# than vLLM ran, where vLLM 0.19's own per-layer timings on that GPU and the prior agree with the run within 2%.
DEFAULT_GPUS = frozenset(GPU_DIRS) - {"rtx-pro-6000-server"}
GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block"}
MOE_DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "mxfp4": "w4a16_mxfp4"}
KV_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
FORMAT = "batchsim-aic-grids/5"
# Collectives: latency + bytes / bandwidth fitted per table (the small-message rows are launch/latency noise).
COMM_BASELINE = {"flops": [], "bytes": [(2.0, (1,))], "peak_flops_per_s": 1.0, "fit": "latency_bandwidth"}


def tables_root() -> Path | None:
    """systems/data of the installed aiconfigurator-core package, or None without the extra."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"


def _choices(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


def table_dir(root: Path, gpu: str, family: str, framework: str, version: str | None,
              needs: str = "*.parquet") -> Path:
    """ROOT/<gpu>/<family>/<framework>/<version>; a GPU, framework or version the tables lack is a
    one-line CatalogError listing what is there. version None: the newest holding a `needs` file."""
    if gpu not in _choices(root):
        raise CatalogError(f"aic: no kernel tables for GPU {gpu!r}; available: {', '.join(_choices(root))}")
    fams = root / gpu / family
    if framework not in _choices(fams):
        raise CatalogError(f"aic: no {family} tables for framework {framework!r} on {gpu}; "
                           f"available: {', '.join(_choices(fams)) or 'none'}")
    versions = _choices(fams / framework)
    if version is None:
        versions = [v for v in versions if any((fams / framework / v).glob(needs))]
        if not versions:
            raise CatalogError(f"aic: no {needs} under {family}/{framework} on {gpu}")
        return fams / framework / max(versions, key=version_key)
    if version not in versions:
        raise CatalogError(f"aic: no {family} tables for {framework} {version!r} on {gpu}; "
                           f"available: {', '.join(versions)}")
    return fams / framework / version


def candidate_dirs(root: Path, gpu: str, family: str, framework: str, version: str | None, needs: str) -> list[Path]:
    """The folder for `version`, or (None) every version holding a `needs` file, newest first: a family
    whose newest table lacks the model's shapes falls back to an older one. [] when there is none."""
    base = root / gpu / family / framework
    if version is not None:
        return [base / version] if (base / version / needs).exists() else []
    found = [p for p in base.iterdir() if (p / needs).exists()] if base.is_dir() else []
    return sorted(found, key=lambda p: version_key(p.name), reverse=True)


def version_key(v: str):
    return tuple(int(x) if x.isdigit() else -1 for x in v.replace("rc", ".").replace("post", ".").split("."))


def _read(path: Path, columns=None):
    import pandas as pd   # pyarrow comes with the extra
    return pd.read_parquet(path, columns=columns)


def build_grids(model: ModelShape, gpu: GPU, d: Deployment, framework: str = "vllm",
                version: str | None = None, root: Path | None = None) -> dict:
    """Every family the tables have for this (model, GPU, deployment), with provenance and held-out error."""
    root = root or tables_root()
    if root is None:
        raise CatalogError("aic: the aiconfigurator-core tables are not installed (pip install -e '.[aic]')")
    if gpu.name not in GPU_DIRS:
        raise CatalogError(f"aic: no kernel tables for GPU {gpu.name!r}; available: {', '.join(GPU_DIRS)}")
    g, fmt, kv = GPU_DIRS[gpu.name], d.weight_format(model), d.kv_format()
    out = {"format": FORMAT, "families": {}, "sources": {}, "tables": {}}

    def note(family, path, rows):
        out["tables"][family] = str(path.relative_to(root))
        out["sources"][family] = f"aiconfigurator {path.relative_to(root).as_posix()} ({rows} rows)"

    gemm_dir = table_dir(root, g, "gemm", framework, version, "gemm_perf.parquet")
    gemm = _read(gemm_dir / "gemm_perf.parquet", ["gemm_dtype", "m", "n", "k", "latency"])
    for name, dtype in {"gemm_bf16": "bf16", "gemm_weights": fmt}.items():
        rows = gemm[gemm["gemm_dtype"] == GEMM_DTYPES.get(dtype, "-")]
        if len(rows):
            e = 2.0 if dtype in ("bf16", "fp16") else 1.0
            base = {"flops": [(2.0, (1, 1, 1))], "bytes": [(2.0, (1, 0, 1)), (e, (0, 1, 1)), (2.0, (1, 1, 0))],
                    "peak_flops_per_s": gpu.peak_flops_per_s("bf16" if e == 2.0 else "fp8"),
                    "bytes_per_s": gpu.hbm_bytes_per_s}
            out["families"][name] = family(rows, ("m", "n", "k"), ("m", "n", "k"), (1.0, 1.0, 1.0), base)
            note(name, gemm_dir / "gemm_perf.parquet", len(rows))
    attn_dir = table_dir(root, g, "attention", framework, version, "generation_attention_perf.parquet")
    if not model.is_mla:
        heads, kv_heads = model.num_heads // d.tp, max(1, model.num_kv_heads // d.tp)
        windows = {"full": 0, **({"window": model.sliding_window} if model.sliding_window else {})}
        for kind, table, cols, slopes in (("prefill", "context", ("batch_size", "isl"), (1.0, 2.0)),
                                          ("decode", "generation", ("batch_size", "step"), (1.0, 1.0))):
            t = _read(attn_dir / f"{table}_attention_perf.parquet")
            if "window_size" not in t:   # older tables (vLLM 0.14) measured full attention only
                t = t.assign(window_size=0)
            t = t[(t["num_heads"] == heads) & (t["num_key_value_heads"] == kv_heads) & (t["head_dim"] == model.head_dim)
                  & (t["kv_cache_dtype"] == KV_DTYPES.get(kv, "-"))]
            if kind == "decode":
                t = t.assign(step=t["step"] + 1)   # `step` tokens cached; the decoded one makes step + 1
            hd, kv_e = model.head_dim, 2.0 if kv != "fp8" else 1.0
            if kind == "prefill":   # causal: 4 hd heads b isl keys-per-query FLOPs; read Q, K, V, write O
                # (no L2 step for prefill: fitting one made the held-out prefill errors worse on the H100,
                # H200 and B200 tables)
                qkvo = [(hd * (2 * 2.0 * heads + 2 * kv_e * kv_heads), (1, 1, 0))]
                base = {"flops": [(4.0 * hd * heads, (1, 1, 1))], "bytes": qkvo, "cap": [1, 2.0, None]}
            else:   # stream K and V of the (windowed) context once per sequence, plus each sequence's own
                    # work (fitted per_seq_s: at batch 2048 and 2 tokens of context the rows are 7x (L40S)
                    # to 18x (H100) the rest of this shape)
                base = {"flops": [(4.0 * hd * heads, (1, 0, 1))],
                        "bytes": [(2 * kv_e * kv_heads * hd, (1, 0, 1)), (2 * 2.0 * heads * hd, (1, 0, 0))],
                        "cap": [1, 1.0, None], "per_seq_s": 0.0,
                        # KV that fits the L2 is served from it: the rows step up once b x context x KV
                        # bytes outgrow it (L40S ~3x, H100 ~1.4x; tablegrid.baseline_s)
                        "l2_bytes": gpu.l2_bytes}
            base.update(peak_flops_per_s=gpu.bf16_flops_per_s, bytes_per_s=gpu.hbm_bytes_per_s)
            for wname, w in windows.items():
                rows = t[t["window_size"] == w]
                if len(rows):
                    cap = [base["cap"][0], base["cap"][1], float(w or 1e18)]
                    # The L2 step only for full attention: a window's KV per call reaches the L2 size only at
                    # batches of hundreds, where per-sequence work, not streaming, sets the time: a step
                    # fitted there fits the wrong cause and made the window family's held-out error worse.
                    fam = {**base, "cap": cap, **({"l2_bytes": None} if w else {})}
                    out["families"][f"{kind}_attn_{wname}"] = family(rows, cols, cols, slopes, fam)
                    note(f"{kind}_attn_{wname}", attn_dir / f"{table}_attention_perf.parquet", len(rows))
    if model.is_mla and (model.kv_lora_rank, model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim) \
            == (512, 64, 128, 128):   # the tables time DeepSeek-V3's MLA block; other MLA shapes keep the prior
        _mla_modules(out, root, g, gpu, model, d, fmt, kv, framework, version, note)
    if model.is_moe:
        _moe(out, root, g, gpu, model, d, fmt, framework, version, note)
    if d.tp > 1:
        for comm_dir in candidate_dirs(root, g, "comm", framework, version, "custom_allreduce_perf.parquet"):
            t = _read(comm_dir / "custom_allreduce_perf.parquet")
            rows = t[t["num_gpus"] == d.tp]
            if "backend" in rows:   # CUDA-graph captured, as engines serve (the eager rows are slower)
                rows = rows[rows["backend"].astype(str).str.endswith("_graph")]
            if len(rows):
                # message_size counts elements (aiconfigurator's collector: a [tokens, 4096] tensor of that size)
                out["families"]["allreduce"] = family(rows, ("elements",), ("message_size",), (1.0,), COMM_BASELINE)
                note("allreduce", comm_dir / "custom_allreduce_perf.parquet", len(rows))
                break
    return out


def _moe(out, root, g, gpu, model, d, fmt, framework, version, note) -> None:
    """Routed experts (fused MoE kernels, balanced routing) at the model's expert shapes and TP/EP split;
    `num_tokens` is every token entering the layer on a rank (the collector routes them all and keeps the
    local experts' share)."""
    tp_moe, ep_moe = (1, d.ep) if d.ep > 1 else (d.expert_tp, 1)
    rows = []
    for moe_dir in candidate_dirs(root, g, "moe", framework, version, "moe_perf.parquet"):
        t = _read(moe_dir / "moe_perf.parquet")
        rows = t[(t["moe_dtype"] == MOE_DTYPES.get(fmt, "-")) & (t["hidden_size"] == model.hidden_size)
                 & (t["inter_size"] == model.moe_intermediate_size) & (t["topk"] == model.experts_per_token)
                 & (t["num_experts"] == model.num_experts) & (t["moe_tp_size"] == tp_moe)
                 & (t["moe_ep_size"] == ep_moe) & (t["distribution"] == "balanced")]
        if len(rows):
            break
    if len(rows):   # roofline shape: routed tokens' FLOPs; weights of the experts they hit (at most all local)
        ep, h, k = max(ep_moe, 1), model.hidden_size, model.experts_per_token
        width = model.moe_intermediate_size / tp_moe
        base = {"flops": [(2.0 * k / ep * 3 * h * width, (1, 0))], "bytes": [(3 * h * width * WEIGHT_BYTES[fmt], (0, 1))],
                "cap": [0, ep / k, model.num_experts / ep], "bytes_per_s": gpu.hbm_bytes_per_s,
                "peak_flops_per_s": gpu.peak_flops_per_s("fp8" if fmt.startswith("fp8") else "bf16")}
        out["families"]["moe"] = family(rows, ("tokens",), ("num_tokens",), (1.0,), base)
        note("moe", moe_dir / "moe_perf.parquet", len(rows))


def _mla_modules(out, root, g, gpu, model, d, fmt, kv, framework, version, note) -> None:
    """DeepSeek-V3's whole MLA attention block (its projections included: the rows depend on the GEMM
    format) for prefill (batch, new tokens) and decode (batch, context), at this GPU's heads."""
    try:
        mla_dir = table_dir(root, g, "mla", framework, version, "mla_generation_module_perf.parquet")
    except CatalogError:
        return
    heads = model.num_heads // d.tp
    for kind, table, cols, slopes in (("prefill", "context", ("batch_size", "isl"), (1.0, 2.0)),
                                      ("decode", "generation", ("batch_size", "step"), (1.0, 1.0))):
        path = mla_dir / f"mla_{table}_module_perf.parquet"
        if not path.exists():
            continue
        t = _read(path)
        rows = t[(t["num_heads"] == heads) & (t["kv_cache_dtype"] == KV_DTYPES.get(kv, "-"))
                 & (t["gemm_type"] == GEMM_DTYPES.get(fmt, "-"))]
        if len(rows):
            base = _mla_baseline(kind, gpu, model, heads, fmt, kv)
            out["families"][f"mla_{kind}_module"] = family(rows, cols, cols, slopes, base)
            note(f"mla_{kind}_module", path, len(rows))


def _mla_baseline(kind: str, gpu: GPU, m: ModelShape, heads: int, fmt: str, kv: str) -> dict:
    """Roofline shape of one MLA block call at (batch, tokens): its projections (Q down/up, KV down/up,
    output; the down projections unsplit by TP) read once per call and applied per token, plus attention.
    Prefill decompresses K and V (causal: heads (qk + v) isl^2 FLOPs per sequence); decode attends in the
    compressed space (absorbed: heads (4 kv_lora + 2 rope) FLOPs and kv_lora + rope cached values per key)."""
    h, ql, kl, r = m.hidden_size, m.q_lora_rank or m.hidden_size, m.kv_lora_rank, m.qk_rope_head_dim
    qk, v = m.qk_nope_head_dim + r, m.v_head_dim
    params = h * ql * (m.q_lora_rank > 0) + h * (kl + r) + heads * (ql * qk + kl * (m.qk_nope_head_dim + v) + v * h)
    weights = [(params * WEIGHT_BYTES[fmt], (0, 0))]
    if kind == "prefill":
        flops = [(2.0 * params, (1, 1)), (heads * (qk + v), (1, 2))]
        moved = [(4.0 * h, (1, 1))]   # the hidden states in and out, 16-bit
    else:
        flops = [(2.0 * params, (1, 0)), (heads * (4.0 * kl + 2.0 * r), (1, 1))]
        moved = [((kl + r) * (1.0 if kv == "fp8" else 2.0), (1, 1)), (4.0 * h, (1, 0))]
    return {"flops": flops, "bytes": weights + moved, "bytes_per_s": gpu.hbm_bytes_per_s,
            "peak_flops_per_s": gpu.peak_flops_per_s("fp8" if fmt.startswith("fp8") else "bf16")}


def cache_dir() -> Path:
    return Path(os.environ.get("BATCHSIM_CACHE", Path.home() / ".cache" / "batchsim")) / "aic"


def load_grids(model: ModelShape, gpu: GPU, d: Deployment, framework: str = "vllm",
               version: str | None = None) -> dict:
    """build_grids, cached by everything it depends on (shapes, GPU, deployment, framework, version,
    the installed package's version)."""
    import importlib.metadata
    pkg = importlib.metadata.version("aiconfigurator-core")
    key = [asdict(model), gpu.name, asdict(d), framework, version, pkg, FORMAT]
    path = cache_dir() / f"{content_hash(key, length=20)}.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            pass   # a torn cache file: rebuild it
    grids = build_grids(model, gpu, d, framework, version)
    grids["provenance"] = {"package": f"aiconfigurator-core {pkg}", "framework": framework,
                           "version": version or "newest", "gpu_tables": GPU_DIRS[gpu.name],
                           "publisher": "NVIDIA ai-dynamo/aiconfigurator (Apache-2.0), systems/data"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, grids, indent=None)
    except OSError:
        pass   # a read-only home: use the grids uncached
    return grids


class AicCostModel(RooflineCostModel):
    """The roofline prior with the table-backed families swapped in (same protocol, seconds)."""

    def __init__(self, model: ModelShape, gpu: GPU, deployment: Deployment, grids: dict):
        super().__init__(model, gpu, deployment=deployment)
        self.grids = grids
        self._g = {name: TableFamily(f) for name, f in grids["families"].items()}
        self.mla_modules = "mla_prefill_module" in self._g and "mla_decode_module" in self._g
        if self.mla_modules:   # the MLA module rows include the attention projections
            self.attn_gemms = []
        self.guard = {}
        for name, reason in table_guard(self).items():   # cells far off the physics: the prior instead
            self._g.pop(name, None)
            self.guard[name] = reason
        self.mla_modules = "mla_prefill_module" in self._g and "mla_decode_module" in self._g

    def describe(self) -> dict:
        sources = {f: "roofline prior" for f in ("gemm", "prefill_attn", "decode_attn", "moe", "allreduce",
                                                  "alltoall", "elementwise", "sampling", "overheads")
                   if not any(t.startswith(f) for t in self.grids["sources"])
                   and not (self.mla_modules and f in ("prefill_attn", "decode_attn"))}
        sources.update({f: v for f, v in self.grids["sources"].items() if f not in self.guard})
        sources.update({f: f"roofline prior (table guard: {why})" for f, why in self.guard.items()})
        if self.wb != self.dt and "gemm_weights" not in sources:
            sources["gemm_weights"] = f"roofline prior (no {self.deployment.weight_format(self.model)} GEMM rows)"
        return {**super().describe(), "kind": "aic",
                "source": f"aiconfigurator kernel tables ({self.grids['provenance']['package']}, "
                          f"{self.grids['provenance']['framework']} {self.grids['provenance']['version']})",
                "provenance": self.grids["provenance"], "family_sources": sources,
                "table_guard": dict(self.guard) or "every table family within its bounds",
                "held_out_error": {f: v["held_out"] for f, v in self.grids["families"].items()}}

    def _gemm_s(self, m, n, k, quantized=True):
        """16-bit GEMMs (attention of mxfp4 models, router, LM head) from the bf16 rows, the others from the
        weight format's; a format the tables lack (nvfp4 on Hopper) keeps the roofline.

        An FP8 row times the linear with its input's quantisation (the collector runs vLLM's FP8 linear
        layer), which a compiled vLLM model fuses into the RMSNorm or SiLU*mul before every linear but
        o_proj; so the GEMM is the row less that kernel as the prior prices it, and o_proj's own
        quantisation is priced once, with the elementwise kernels, as the prior does (never below half
        the row: a guard on the estimate, which the decode rows' 2.8-3.7 us over bf16 bound)."""
        bf16 = not quantized or self.wb == self.dt
        grid = self._g.get("gemm_bf16" if bf16 else "gemm_weights")
        if grid is None:
            return super()._gemm_s(m, n, k, quantized)
        t = grid(m, n, k)
        return max(t - self.input_quant_s(m, k), 0.5 * t) if (self.scaled_mm and not bf16) else t

    def _prefill_attention_s(self, prefill, window=None):
        if self.mla_modules:   # a mixed step reads the projection weights in both modules: an upper bound
            return self._g["mla_prefill_module"](*prefill_coords([n for n, _ in prefill], [c for _, c in prefill]))
        grid = self._g.get("prefill_attn_window" if window else "prefill_attn_full")
        if grid is None:
            return super()._prefill_attention_s(prefill, window)
        b, length = prefill_coords([n for n, _ in prefill], [c for _, c in prefill])
        t = grid(b, length)
        if self._prefill_tile is not None and any(c for _, c in prefill):
            # The tables time fresh prompts; a chunk after a cached prefix runs as FlashAttention's tiles do
            # (costmodels/attention_kernel.py: on FA2 its few query tiles each walk the whole prefix, 5x the
            # FLOPs' time for 16 tokens after 4,096 in vLLM 0.19's own timings). So the table's price of the
            # fresh prompts of the same work plus what the tile model says the step costs beyond them (the
            # table keeps its own fixed time). Where the tiles price the step below that fresh prompt (fewer
            # query tiles, so less per-tile overhead: a long chunk after a moderate prefix) the table stands:
            # vLLM 0.19's chunks of 512-2,048 tokens after 512-8,192 run within 2% of the table's fresh
            # equivalent (median, RTX PRO 6000 Server). Over all 233 of its prefill chunks, median |error|
            # 12.0% -> 4.8%, p90 73% -> 17% (`python -m benchmarks.kernel_efficiency`, "[aic] prefill").
            t += max(0.0, super()._prefill_attention_s(prefill, window)
                     - super()._prefill_attention_s([(length, 0)] * int(b), window))
        return t

    def _decode_attention_s(self, context_sum, num_seqs):
        full = self._g.get("mla_decode_module" if self.mla_modules else "decode_attn_full")
        if full is None:
            return super()._decode_attention_s(context_sum, num_seqs)
        if not isinstance(context_sum, float):
            return np.array([self._decode_attention_s(float(c), num_seqs) for c in context_sum])
        t = self.model.num_layers * full(float(num_seqs), context_sum / num_seqs)
        if self.num_sliding:
            w = self._g.get("decode_attn_window", full)
            mean = min(context_sum / num_seqs, float(self.model.sliding_window))
            t += self.num_sliding * (w(float(num_seqs), mean) - full(float(num_seqs), context_sum / num_seqs))
        return t

    def _prefill_attention_total_s(self, prefill):
        full = self._prefill_attention_s(prefill)
        if not self.num_sliding:
            return self.model.num_layers * full
        return ((self.model.num_layers - self.num_sliding) * full
                + self.num_sliding * self._prefill_attention_s(prefill, self.model.sliding_window))

    def _routed_experts_s(self, num_tokens, group_tokens=None):
        grid = self._g.get("moe")
        if grid is None:
            return super()._routed_experts_s(num_tokens, group_tokens)
        d = self.deployment   # the busiest rank's share: the imbalance knob scales its tokens
        # every DP rank's tokens are gathered, with or without EP (simcore/dp_lockstep.py `group_tokens`)
        tokens = num_tokens * d.data_parallel_size if group_tokens is None else group_tokens
        return grid(tokens * d.expert_load_imbalance)

    def _allreduce_s(self, num_tokens):
        grid = self._g.get("allreduce")
        if self.tp == 1 or grid is None:
            return super()._allreduce_s(num_tokens)
        return 2 * grid(float(num_tokens * self.model.hidden_size))


def aic_cost_model(spec: str, model: ModelShape, gpu: GPU, d: Deployment) -> AicCostModel:
    """`spec`: "aic", "aic:<framework>" or "aic:<framework>:<version>"."""
    parts = spec.split(":")
    framework = parts[1] if len(parts) > 1 and parts[1] else "vllm"
    version = parts[2] if len(parts) > 2 and parts[2] else None
    return AicCostModel(model, gpu, d, load_grids(model, gpu, d, framework, version))
