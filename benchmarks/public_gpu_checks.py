"""The default GPU cost model held to public vLLM measurements on GPUs we have no runs of (A100), beside the
same source's H100 ones.

    python -m benchmarks.public_gpu_checks --out results/public-gpu [--models roofline,default] [--points ID,...]

Each point below is one published `vllm bench serve` result (vLLM V1, the version in the row), transcribed
with its setup: model, TP, the engine limits `vllm serve` defaulted to on that GPU, the dataset's lengths,
the load (every request at t = 0, or a closed loop of N clients), and the measured benchmark duration,
TTFT mean/p99 and TPOT mean. The `assumed` column says what the source leaves unsaid and what was taken.
Each point is replayed through `experiments.simulate` with each cost model: `roofline` (the datasheet
prior), `default` (what a plain run picks: the [aic] tables when installed and they cover the GPU, else the
prior) and, on GPUs where vLLM runs FlashAttention 2, `roofline-no-fa2-mix`: the prior with the GPU
described without a compute capability (`hardware: {base: a100-80gb, compute_capability: null}`), which
leaves out the FlashAttention 2 kernel's two terms (costmodels/attention_kernel.py): the mixed
prefill+decode re-reads and the prefill attention tile by tile (priced by FLOPs instead).
It prints real vs simulated per metric and the errors (simulated / real - 1); `--out DIR` writes
points.csv (one row per point and cost model) and report.md.

Metrics as `vllm bench serve` computes them: duration from the first request sent to the last token;
TTFT per request from sending to the first token; TPOT per request (E2E - TTFT) / (output - 1) over the
requests with more than one output token, then the mean over requests.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commandline.outputs import OutputError, out_dir  # noqa: E402
from commandline.parser import Parser  # noqa: E402
from policies.vllm_versions import nearest_modelled  # noqa: E402

GPUSTACK = "https://github.com/gpustack/gpustack/blob/main/docs/performance-lab"
MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"

# `vllm serve`'s engine limits when not given (vllm/engine/arg_utils.py, `get_batch_defaults`, unchanged from
# 0.9 to 0.32): an OpenAI server on a GPU of 70 GiB or more that is not an A100 gets 1,024 sequences and an
# 8,192-token budget; any other GPU, the A100 80 GB included (PR #17885: a larger budget cut its throughput),
# 256 and 2,048.
SERVE_DEFAULTS = {"a100-80gb": (256, 2048), "a100-40gb": (256, 2048), "h100-sxm": (1024, 8192)}
# Qwen3's chat template around a single user turn (`<|im_start|>user\n` ... `<|im_end|>\n<|im_start|>assistant\n`):
# the server prefills these beside the dataset's prompt, which `vllm bench serve` does not count.
QWEN3_CHAT_TOKENS = 8
# ShareGPT_V3 through `vllm bench serve` (prompts of at most 1,024 tokens) as lognormal lengths of spread 1.0
# (an assumption: the runs give only token totals), cut at 1,024 by redrawing; a point's `lognormal:M` gives
# the median M that makes the mean (after the cut) the run's own total / requests: 158 and 143 for 217.4 prompt
# and 201.6 generated tokens a request (the 1,000-prompt runs), 174 and 162 for 232.6 and 220.6 (the first 100).
SHAREGPT_SIGMA, SHAREGPT_MAX = 1.0, 1024

COLUMNS = ("id", "gpu", "vllm", "model", "tp", "max_model_len", "load", "num_requests", "prompt", "output",
           "real_duration_s", "real_ttft_mean_ms", "real_ttft_p99_ms", "real_tpot_mean_ms", "real_output_tokens",
           "source", "assumed")
_G14 = "ShareGPT lengths: lognormal (SHAREGPT_SIGMA above)"
_G32 = "engine limits: vLLM's defaults on this GPU (SERVE_DEFAULTS)"
_GS = ("A100 size not stated: the 80 GB (Qwen3-32B's 65 GB of weights need it); TP 1 (no -tp given); "
       "prefix caching and chunked prefill on (V1 defaults); 8 chat-template tokens added to each prompt; ")
_HS = "TP 1 (no -tp given); prefix caching and chunked prefill on (V1 defaults); 8 chat-template tokens added; "
# The points: one published result each. prompt/output: "fixed:N" (the run's total / requests) or
# "lognormal:M" (ShareGPT: median M, SHAREGPT_SIGMA, at most SHAREGPT_MAX).
# load: "burst" (every request at t = 0: `--request-rate inf`, no concurrency cap) or "closed:N"
# (`--max-concurrency N`). NaN: the source does not give the figure.
POINTS = [
    # gpustack performance lab, vLLM v0.11.0, `vllm serve Qwen/Qwen3-14B`, `vllm bench serve --backend openai-chat`
    ("a100-q14-sharegpt", "a100-80gb", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 1000, "lognormal:158",
     "lognormal:143", 106.82, 41875.09, 83576.82, 114.34, 201605, f"{GPUSTACK}/qwen3-14b/a100.md", _GS + _G14),
    ("a100-q14-32k", "a100-80gb", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 100, "fixed:32000", "fixed:100",
     724.56, 359648.08, 714338.15, 445.58, 9891, f"{GPUSTACK}/qwen3-14b/a100.md", _GS + _G32),
    ("a100-q14-4k", "a100-80gb", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 500, "fixed:3996", "fixed:200",
     407.05, 197625.03, 396056.32, 254.61, 99783, f"{GPUSTACK}/qwen3-14b/a100.md", _GS + _G32),
    ("a100-q14-2k", "a100-80gb", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 500, "fixed:1996", "fixed:100",
     175.66, 86908.30, 170607.65, 301.73, 50000, f"{GPUSTACK}/qwen3-14b/a100.md", _GS + _G32),
    ("a100-q14-128", "a100-80gb", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 1000, "fixed:128", "fixed:4",
     26.79, 19451.46, 26523.59, 233.35, 4000, f"{GPUSTACK}/qwen3-14b/a100.md", _GS + _G32),
    # the same lab's Qwen3-32B on the A100 (`--max-model-len 32768` for the ShareGPT run only)
    ("a100-q32-sharegpt", "a100-80gb", "0.11.0", "Qwen/Qwen3-32B", 1, 32768, "burst", 1000, "lognormal:158",
     "lognormal:143", 241.94, 105557.78, 209863.50, 149.67, 201396, f"{GPUSTACK}/qwen3-32b/a100.md", _GS + _G14),
    ("a100-q32-32k", "a100-80gb", "0.11.0", "Qwen/Qwen3-32B", 1, 40960, "burst", 100, "fixed:32000", "fixed:100",
     1783.59, 890711.38, 1760024.36, 67.87, 7699, f"{GPUSTACK}/qwen3-32b/a100.md", _GS + _G32),
    ("a100-q32-4k", "a100-80gb", "0.11.0", "Qwen/Qwen3-32B", 1, 40960, "burst", 500, "fixed:3996", "fixed:200",
     1141.94, 566579.70, 1116945.95, 96.19, 99893, f"{GPUSTACK}/qwen3-32b/a100.md", _GS + _G32),
    ("a100-q32-2k", "a100-80gb", "0.11.0", "Qwen/Qwen3-32B", 1, 40960, "burst", 500, "fixed:1996", "fixed:100",
     415.71, 208397.03, 408103.76, 143.23, 50000, f"{GPUSTACK}/qwen3-32b/a100.md", _GS + _G32),
    ("a100-q32-128", "a100-80gb", "0.11.0", "Qwen/Qwen3-32B", 1, 40960, "burst", 1000, "fixed:128", "fixed:4",
     49.57, 31177.64, 48960.57, 528.57, 4000, f"{GPUSTACK}/qwen3-32b/a100.md", _GS + _G32),
    # the same lab, same commands, one H100 SXM: tells a source's setup from the GPU
    ("h100-q14-sharegpt", "h100-sxm", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 1000, "lognormal:158",
     "lognormal:143", 63.53, 22141.21, 31156.86, 226.03, 201648, f"{GPUSTACK}/qwen3-14b/h100.md", _HS + _G14),
    ("h100-q14-32k", "h100-sxm", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 100, "fixed:32000", "fixed:100",
     386.80, 191024.43, 380407.97, 277.44, 9855, f"{GPUSTACK}/qwen3-14b/h100.md", _HS + _G32),
    ("h100-q14-4k", "h100-sxm", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 500, "fixed:3996", "fixed:200",
     227.57, 112716.92, 219749.74, 132.45, 99803, f"{GPUSTACK}/qwen3-14b/h100.md", _HS + _G32),
    ("h100-q14-2k", "h100-sxm", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 500, "fixed:1996", "fixed:100",
     98.91, 50716.13, 94614.51, 206.51, 50000, f"{GPUSTACK}/qwen3-14b/h100.md", _HS + _G32),
    ("h100-q14-128", "h100-sxm", "0.11.0", "Qwen/Qwen3-14B", 1, 40960, "burst", 1000, "fixed:128", "fixed:4",
     22.72, 18282.75, 22564.77, 525.31, 4000, f"{GPUSTACK}/qwen3-14b/h100.md", _HS + _G32),
    # the same lab's latency page, one H100 SXM, `vllm serve Qwen/Qwen3-8B`, the first 100 ShareGPT prompts with
    # `--max-concurrency 1, 2, 4, 8` (`qwen3-8b/h100-latency.md`, "Other Benchmark Cases", baseline): light load
    ("h100-q8-c1", "h100-sxm", "0.11.0", "Qwen/Qwen3-8B", 1, 40960, "closed:1", 100, "lognormal:174",
     "lognormal:162", 166.04, 59.01, 73.49, 7.28, 22061, f"{GPUSTACK}/qwen3-8b/h100-latency.md", _HS + _G14),
    ("h100-q8-c2", "h100-sxm", "0.11.0", "Qwen/Qwen3-8B", 1, 40960, "closed:2", 100, "lognormal:174",
     "lognormal:162", 85.78, 63.78, 93.70, 7.37, 22061, f"{GPUSTACK}/qwen3-8b/h100-latency.md", _HS + _G14),
    ("h100-q8-c4", "h100-sxm", "0.11.0", "Qwen/Qwen3-8B", 1, 40960, "closed:4", 100, "lognormal:174",
     "lognormal:162", 44.40, 64.00, 98.59, 7.38, 22061, f"{GPUSTACK}/qwen3-8b/h100-latency.md", _HS + _G14),
    ("h100-q8-c8", "h100-sxm", "0.11.0", "Qwen/Qwen3-8B", 1, 40960, "closed:8", 100, "lognormal:174",
     "lognormal:162", 24.05, 74.57, 204.11, 7.71, 22061, f"{GPUSTACK}/qwen3-8b/h100-latency.md", _HS + _G14),
    # one client at a time, Llama-3.1-8B-Instruct BF16 on an A100 40 GB (Lambda), `vllm serve` defaults,
    # `--dataset-name random --random-input-len 1024 --random-output-len 128 --ignore-eos --max-concurrency 1
    # --num-prompts 20`: the page gives "about 75 tokens/sec" of decode for one request, so TPOT ~ 1000/75 ms
    ("a100-40-llama8-c1", "a100-40gb", "0.23.0", "meta-llama/Llama-3.1-8B-Instruct", 1, 131072, "closed:1", 20,
     "fixed:1024", "fixed:128", math.nan, math.nan, math.nan, 1000 / 75, 20 * 128, MUSGRAVE,
     "TPOT from the page's rounded 'about 75 tokens/sec' (no result block given); completions endpoint (no chat "
     "template); prefix caching on (V1 default) but random prompts share nothing; " + _G32),
]
# output_tok_s: generated tokens / duration (the real side from the transcribed totals); it, not the duration,
# compares where the replay's sampled lengths total more or fewer tokens than the run's
METRICS = ("output_tok_s", "duration_s", "ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms")
MODELS = ("roofline", "default")
NO_FA2_MIX = "roofline-no-fa2-mix"


def table() -> pd.DataFrame:
    return pd.DataFrame(POINTS, columns=COLUMNS)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _lengths(spec: str, which: str, chat_tokens: int) -> dict:
    kind, _, n = spec.partition(":")
    if kind not in ("fixed", "lognormal") or not n.isdigit():
        raise ValueError(f"{which} length {spec!r}: expected fixed:N or lognormal:MEDIAN")
    if kind == "lognormal":   # the template's tokens ride on every prompt: the whole distribution shifts
        return {"dist": "lognormal", "median": int(n) + chat_tokens, "sigma": SHAREGPT_SIGMA,
                "max": SHAREGPT_MAX + chat_tokens}
    return {"dist": "fixed", "value": int(n) + chat_tokens}


def point_config(row: pd.Series, hardware=None) -> dict:
    """The sweep-style point of one published result (hardware: the catalog GPU, or a mapping in its place)."""
    seqs, budget = SERVE_DEFAULTS[row["gpu"]]
    chat = QWEN3_CHAT_TOKENS if row["model"].startswith("Qwen/Qwen3") else 0
    load = row["load"]
    if load == "burst":
        arrival = {"process": "poisson", "rate_per_s": math.inf}
    elif load.startswith("closed:") and load[7:].isdigit():
        arrival = {"process": "closed", "concurrency": int(load[7:]), "think_time_s": 0}
    else:
        raise ValueError(f"load {load!r}: expected burst or closed:N")
    return {"model": row["model"], "hardware": hardware or row["gpu"],   # a Hugging Face id costmodels resolves
            "tensor_parallel_size": int(row["tp"]), "dtype": "bf16",
            "engine": {"policy": "chunked_prefill", "max_num_seqs": seqs, "max_num_batched_tokens": budget,
                       "max_model_len": int(row["max_model_len"]), "enable_prefix_caching": True,
                       "gpu_memory_utilization": 0.9, "vllm_version": nearest_modelled(row["vllm"])},
            "workload": {"num_requests": int(row["num_requests"]), "arrival": arrival,
                         "prompt_tokens": _lengths(row["prompt"], "prompt", chat),
                         "output_tokens": _lengths(row["output"], "output", 0)}}


def bench_metrics(requests: pd.DataFrame) -> dict:
    """`vllm bench serve`'s figures from a request table (times in s, results in s and ms)."""
    fin = requests[requests["status"] == "finished"]
    ttft = (fin["first_token_s"] - fin["arrival_s"]) * 1e3
    many = fin[fin["output_tokens"] > 1]
    tpot = (many["finish_s"] - many["first_token_s"]) * 1e3 / (many["output_tokens"] - 1)
    duration = float(fin["finish_s"].max() - requests["arrival_s"].min())
    return {"duration_s": duration, "output_tok_s": float(fin["output_tokens"].sum()) / duration,
            "ttft_mean_ms": float(ttft.mean()), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "tpot_mean_ms": float(tpot.mean()), "output_tokens": int(fin["output_tokens"].sum()),
            "prompt_tokens": int(fin["prompt_tokens"].sum()) if "prompt_tokens" in fin else -1,
            "finished": len(fin), "requests": len(requests)}


def variants(row: pd.Series, models: list[str]) -> list[tuple[str, object, str | None]]:
    """(name, hardware, profile) per cost model to run on this point."""
    from costmodels.attention_kernel import mixed_batch_rereads_kv
    from costmodels.catalog import get_gpu
    out = [(m, None, "roofline" if m == "roofline" else None) for m in models]
    if "roofline" in models and mixed_batch_rereads_kv(get_gpu(row["gpu"])):
        out.append((NO_FA2_MIX, {"base": row["gpu"], "name": f"{row['gpu']}-no-fa2-mix",
                                 "compute_capability": None}, "roofline"))
    return out


def replay(row: pd.Series, name: str, hardware, profile: str | None) -> dict:
    from experiments.config import resolve_point
    from experiments.simulate import simulate
    cfg = resolve_point(point_config(row, hardware))
    t0 = time.perf_counter()
    res = simulate(dataclasses.replace(cfg, profile=profile), 0)
    m = bench_metrics(res.requests)
    cm = res.resolved.get("cost_model") if isinstance(res.resolved, dict) else None
    out = {"id": row["id"], "gpu": row["gpu"], "model": row["model"], "load": row["load"], "cost_model": name,
           "cost_model_kind": cm.get("kind", "?") if isinstance(cm, dict) else "?",
           "sim_wall_s": round(time.perf_counter() - t0, 1), "sim_finished": m["finished"],
           "sim_requests": m["requests"], "sim_output_tokens": m["output_tokens"],
           "real_output_tokens": int(row["real_output_tokens"])}
    for k in METRICS:
        real = (float(row["real_output_tokens"]) / float(row["real_duration_s"]) if k == "output_tok_s"
                else float(row[f"real_{k}"]))
        out[f"real_{k}"], out[f"sim_{k}"] = real, m[k]
        out[f"err_{k}"] = m[k] / real - 1 if real and not math.isnan(real) else math.nan
    return out


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Median |error| and median error per GPU, load (burst, or a closed loop of a few clients) and cost model."""
    out = []
    load = rows["load"].str.partition(":")[0]
    for (gpu, kind, name), g in rows.groupby([rows["gpu"], load, rows["cost_model"]], sort=False):
        r = {"gpu": gpu, "load": kind, "cost_model": name, "points": len(g)}
        for k in METRICS:
            e = g[f"err_{k}"].dropna()
            r[f"{k} median|err|"] = f"{e.abs().median():.1%}" if len(e) else ""
            r[f"{k} median err"] = f"{e.median():+.1%}" if len(e) else ""
        out.append(r)
    return pd.DataFrame(out)


def report(rows: pd.DataFrame, out: Path | None) -> str:
    from experiments.report import md_table
    t = rows[["id", "cost_model"]].copy()
    for k in METRICS:
        t[f"{k} real"] = rows[f"real_{k}"].map(lambda v: "" if math.isnan(v) else f"{v:,.1f}")
        t[f"{k} sim"] = rows[f"sim_{k}"].map(lambda v: f"{v:,.1f}")
        t[f"{k} err"] = rows[f"err_{k}"].map(lambda v: "" if math.isnan(v) else f"{v:+.0%}")
    lines = ["# Public vLLM measurements on A100 (and the same source's H100) replayed", "",
             "Errors are simulated / real - 1. Points, sources and assumptions: points.csv and "
             "benchmarks/public_gpu_checks.py.", "", md_table(summary(rows)), "", md_table(t), ""]
    text = "\n".join(lines)
    if out is not None:
        (out / "report.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = Parser(prog="python -m benchmarks.public_gpu_checks", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for points.csv and report.md (default: print only)")
    ap.add_argument("--models", default="roofline,default",
                    help="cost models, comma-separated: roofline (datasheet prior), default (what a plain run picks)")
    ap.add_argument("--points", default=None, help="point ids, comma-separated (default: all)")
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        ap.error(f"argument --models: unknown cost model {(bad or [''])[0]!r}; expected roofline and/or default")
    points = table()
    if a.points is not None:
        wanted = [p for p in a.points.split(",") if p]
        unknown = [p for p in wanted if p not in set(points["id"])]
        if unknown or not wanted:
            ap.error(f"argument --points: unknown point {(unknown or [''])[0]!r}; expected ids from "
                     f"{', '.join(points['id'])}")
        points = points[points["id"].isin(wanted)]
    out = None
    if a.out is not None:
        try:
            out = out_dir(a.out)   # before minutes of replay
        except OutputError as e:
            ap.error(str(e))
    rows = []
    for _, row in points.iterrows():
        for name, hardware, profile in variants(row, models):
            r = replay(row, name, hardware, profile)
            rows.append(r)
            say(f"{row['id']} {name}: duration {r['sim_duration_s']:.1f} s (real {r['real_duration_s']:.1f}), "
                f"TTFT mean {r['sim_ttft_mean_ms']:,.0f} ms (real {r['real_ttft_mean_ms']:,.0f}), TPOT mean "
                f"{r['sim_tpot_mean_ms']:.1f} ms (real {r['real_tpot_mean_ms']:.1f}), {r['sim_wall_s']} s")
    setup = ["id", "vllm", "tp", "max_model_len", "num_requests", "prompt", "output", "source", "assumed"]
    df = pd.DataFrame(rows).merge(table()[setup], on="id")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "points.csv", index=False)
    print(report(df, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
