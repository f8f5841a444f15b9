"""The default GPU cost model held to real vLLM runs on real GPUs (the public runs in ../shared/real-runs/).

    python -m benchmarks.gpu_fidelity --out results/gpu-fidelity [--models roofline,default] [--shared PATH]
                                      [--max-stage-s 600] [--stages FILE[,FILE]] [--sets h100,llmservingsim]

1. every `vllm-*-stages.csv` in real-runs/ (sorted), and the files --stages names (one row per
   constant-rate load stage; `vllm-0.15.1-h100-stages.csv`: vLLM 0.15.1, H100 SXM): each stage is rebuilt
   from its README and the client's configuration (constant-rate arrivals for the stage's duration; the
   client's pool of 100 prompts, 10 system prompts times 10 questions, sent in turn over and over, so
   vLLM's prefix cache serves all but the first of each; `ignore_eos` output lengths, chunked prefill,
   prefix caching) with the engine settings of its row, else of its file's name, else of the H100 file's
   README (fidelity/vllm_stages.py: GPU, token budget, sequences, dtype, quantization, KV offload,
   max_model_len) and simulated on its own. A row that cannot be replayed (a GPU or model the simulator
   does not know, a model that does not fit) is kept with the reason under `skipped`;
2. `llmservingsim/<GPU>_<model>/` (vLLM 0.19.0 on an RTX 4090 and an RTX PRO 6000): the real requests
   replayed as sent (fidelity.llmservingsim reads them), on the GPU the run names, with the engine
   arguments its vllm_meta.json records; beside them the peer simulator's errors
   (validation_summary.txt).

Per stage or run it prints real vs simulated TTFT mean/p99, per-token time ((E2E - TTFT) / (output - 1),
the README's definition), E2E mean/p99 and throughput, each side's class (sustained or saturated), and
the summary errors (median and p90 of |error|). For the LLMServingSim runs it also fits each run in
closed form from its requests' times and applies the fit to the others (benchmarks/gpu_cross_fit.py:
cross_fit.csv, cross_fit_params.csv, cross_fit.md). TTFT is as a client measures it: the engine plus the
serving front end (costmodels/frontend.py: `vllm serve` over HTTP for the H100 stages, which `vllm bench
serve` drove; none for the LLMServingSim runs, whose times are all the engine core's: TTFT from the
core receiving the tokenised request). Cost models: `roofline`
(the datasheet prior) and `default` (what a plain `experiments.run` picks: the [aic] tables when installed
and they have the GPU, else the same prior); for a multi-GPU run on a PCIe GPU also `roofline-pcie_host`,
the prior with the GPUs described as having no peer-to-peer path (host_staged_point says why). Each
cost model also prices the decode-only steps each LLMServingSim run's own 1 s ticks show, outside any
scheduling (fidelity/run_ticks.py: step_curves.csv, by requests decoding), and every busy tick whole,
prefill included, against its length (busy_ticks.csv; runs without DP). Writes stages.csv, runs.csv,
step_curves.csv, busy_ticks.csv and report.md under --out.
Without ../shared it says so and exits 0; a `--shared` folder without real-runs/ is refused (exit 2).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.shared_data import shared_folder  # noqa: E402
from commandline.argtypes import positive_float  # noqa: E402
from commandline.exits import run_main  # noqa: E402
from commandline.interrupts import raise_if_interrupted  # noqa: E402
from commandline.outputs import OutputError, out_dir  # noqa: E402
from commandline.parser import Parser  # noqa: E402
from fidelity.vllm_stages import (StageFileError, data_parallel, measured_per_token_ms, per_token_ms,  # noqa: E402
                                  read_stage_file, row_problem, row_settings, stage_files, stage_profile)
from policies.vllm_versions import nearest_modelled  # noqa: E402

STAGES_CSV = "real-runs/vllm-0.15.1-h100-stages.csv"
LSS_DIR = "real-runs/llmservingsim"

# An FP8 checkpoint's id: its base model's id with this suffix (Qwen/Qwen3-32B-FP8, ...-Instruct-FP8,
# RedHatAI/phi-4-FP8-dynamic)
# The client's prompt pool. Each run's inference-perf config (results/config.yaml beside the stage files in
# the source repository) has `shared_prefix: {num_groups: 10, num_prompts_per_group: 10}`, and
# inference-perf's SharedPrefixDataGenerator makes that many prompts once (10 system prompts, 10 questions
# each) and then sends them in turn, over and over (`data_index % len(prompts)`): 100 distinct prompts, so
# from the 101st request on every prompt was sent before and vLLM's prefix cache holds its full blocks
# (docs/sources.md, "inference-perf's shared-prefix prompts"). Replayed as 100 prompts each sent again and
# again; the engine then caches what fits, as vLLM's does.
NUM_SYSTEM_PROMPTS = 10
PROMPTS_PER_SYSTEM_PROMPT = 10
# A stage is saturated when requests wait in queue without bound: its p99 TTFT passes this many seconds
# (the sustained real stages stay under 1 s, the overloaded ones pass 200 s) or the client timed out more
# than 1% of its requests.
SATURATED_TTFT_P99_S = 10.0
METRICS = ("ttft_mean_ms", "ttft_p99_ms", "per_token_ms", "e2e_mean_ms", "e2e_p99_ms", "throughput_tok_s")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stage_point(row: pd.Series, max_stage_s: float, settings: dict | None = None,
                profile: dict | None = None) -> dict:
    """The sweep-style point of one stage, with the engine settings of its row (fidelity.vllm_stages)."""
    settings = settings or row_settings(row)
    profile = profile or stage_profile(row)
    output = stage_output(row, profile)
    rate = float(row["requested_rate_per_s"])
    n = int(round(rate * min(profile["duration_s"], max_stage_s)))
    model = row["model"]
    engine = {"policy": "chunked_prefill", "max_num_seqs": settings["max_num_seqs"],
              "max_num_batched_tokens": settings["max_num_batched_tokens"],
              "max_model_len": settings["max_model_len"], "enable_prefix_caching": True,
              "gpu_memory_utilization": settings["gpu_memory_utilization"]}
    # the run's release: its admission, free-queue and KV-connector rules (policies/vllm_versions.py)
    version = nearest_modelled(settings["vllm_version"])
    if version is not None:
        engine["vllm_version"] = version
    if settings["kv_offload_gb"] > 0:   # the runs' KV CPU offloading (vLLM's OffloadingConnector)
        engine["kv_offload"] = {"cpu_gb": settings["kv_offload_gb"]}
    point = {"model": model, "hardware": settings["gpu"],
             "tensor_parallel_size": int(row["tensor_parallel_size"]), "dtype": settings["dtype"],
             "engine": engine,
             "workload": {"num_requests": n, "arrival": {"process": "constant", "rate_per_s": rate},
                          # each prompt is one of the pool's: all but its last token is the repeated part
                          "prompt_tokens": {"dist": "fixed", "value": 1},
                          "output_tokens": {"dist": "fixed", "value": int(output)},
                          "shared_prefix": {"num_groups": NUM_SYSTEM_PROMPTS * PROMPTS_PER_SYSTEM_PROMPT,
                                            "prefix_tokens": max(1, round(row["prompt_tokens_mean"]) - 1)}}}
    if settings["quantization"]:   # else the checkpoint's (an FP8 checkpoint's id: FP8, costmodels.get_model)
        point["quantization"] = settings["quantization"]
    return data_parallel(point, settings["data_parallel_size"])


def stage_output(row: pd.Series, profile: dict) -> int:
    """Output tokens per request: the counted mean, except Llama-2-7B's, whose counts are unreliable (the H100
    file's README): with ignore_eos the profile's requested length was made, where the profile is known."""
    if row["model"] == "meta-llama/Llama-2-7b-hf" and profile["requested_output"] is not None:
        return int(profile["requested_output"])
    return int(round(row["output_tokens_counted_mean"]))


def sim_metrics(requests: pd.DataFrame, duration_s: float | None = None) -> dict:
    """The stage metrics of a request table (simulated or real), times in ms."""
    fin = requests[requests["status"] == "finished"]
    ttft = (fin["first_token_s"] - fin["arrival_s"]) * 1e3
    e2e = (fin["finish_s"] - fin["arrival_s"]) * 1e3
    out = fin["output_tokens"].astype(float)
    span = duration_s or float(requests["finish_s"].max() - requests["arrival_s"].min())
    return {"ttft_mean_ms": float(ttft.mean()), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "per_token_ms": float((e2e.mean() - ttft.mean()) / max(out.mean() - 1, 1)),
            "e2e_mean_ms": float(e2e.mean()), "e2e_p99_ms": float(np.percentile(e2e, 99)),
            "throughput_tok_s": float(out.sum() / span) if span > 0 else math.nan,
            "finished_fraction": len(fin) / max(len(requests), 1)}


def saturated(ttft_p99_ms: float, failed_fraction: float = 0.0) -> bool:
    return ttft_p99_ms / 1e3 > SATURATED_TTFT_P99_S or failed_fraction > 0.01


def real_class(r: pd.Series) -> str:
    """The run's side of the knee: saturated when its TTFT p99 or its failed share says so (either is enough),
    sustained when its TTFT p99 is known and neither does, unknown when the file has no TTFT p99 and no
    failures to tell (such a stage counts in no class comparison)."""
    p99, failed = r["ttft_p99_ms"], r["failed"]
    if saturated(p99 if pd.notna(p99) else 0.0, failed / max(r["sent"], 1) if pd.notna(failed) else 0.0):
        return "saturated"
    return "unknown" if pd.isna(p99) else "sustained"


# stages.csv's columns besides the metrics: what each row replayed and with which engine settings
SETTING_COLUMNS = ("stage_file", "gpu", "tensor_parallel_size", "data_parallel_size", "max_num_batched_tokens",
                   "max_num_seqs", "dtype", "weights", "gpu_memory_utilization", "kv_offload_gb", "max_model_len",
                   "vllm_version", "profile", "skipped")
STAGE_COLUMNS = (["run", "stage", "rate", "cost_model", "cost_model_kind", "num_requests", "sim_wall_s",
                  "real_class", "sim_class"] + [f"{side}_{k}" for k in METRICS for side in ("real", "sim", "err")]
                 + list(SETTING_COLUMNS))


def file_stages(tables: list[pd.DataFrame], models: list[str], max_stage_s: float,
                keep: Path | None = None) -> pd.DataFrame:
    """Every row of every stage file, simulated once per cost model (or skipped, saying why). With `keep`,
    each stage's rows are appended to that CSV as the stage finishes, so an interrupted run keeps them."""
    rows = []
    for table in tables:
        for _, r in table.iterrows():
            done = stage_rows(r, models, max_stage_s)
            if keep is not None:
                pd.DataFrame(done, columns=STAGE_COLUMNS).to_csv(keep, mode="a" if rows else "w", header=not rows,
                                                                 index=False)
            rows += done
            raise_if_interrupted()   # a Ctrl-C swallowed during the stage (commandline/interrupts.py)
    return pd.DataFrame(rows, columns=STAGE_COLUMNS)


def stage_rows(r: pd.Series, models: list[str], max_stage_s: float) -> list[dict]:
    """One stage file row's stages.csv rows, one per cost model: real and simulated figures with the settings
    used, or the real figures and `skipped` with the reason the row cannot be replayed."""
    from costmodels.catalog import CatalogError
    from experiments.config import resolve_point
    from experiments.configcheck import ConfigError
    from experiments.simulate import simulate
    from simcore.errors import SimulationError
    problem = row_problem(r)
    if problem:   # nothing of the row can be computed: its settings and why
        say(f"{r['experiment']} {r['stage']}: skipped: {problem}")
        return [{"run": r["experiment"], "stage": r["stage"], "rate": r["requested_rate_per_s"], "cost_model": name,
                 "stage_file": r.get("stage_file", ""), "skipped": problem} for name in models]
    settings, profile = row_settings(r), stage_profile(r)
    real_m = {"ttft_mean_ms": r["ttft_mean_ms"], "ttft_p99_ms": r["ttft_p99_ms"],
              "per_token_ms": measured_per_token_ms(r), "e2e_mean_ms": r["e2e_mean_ms"],
              "e2e_p99_ms": r["e2e_p99_ms"], "throughput_tok_s": r["output_tok_per_s"]}
    out = stage_output(r, profile)
    if r["model"] == "meta-llama/Llama-2-7b-hf" and profile["requested_output"] is not None:
        # counted outputs unreliable: per token and throughput from the requested length
        real_m["per_token_ms"] = per_token_ms(r["e2e_mean_ms"], r["ttft_mean_ms"], out)
        real_m["throughput_tok_s"] = r["output_tok_per_s"] * out / r["output_tokens_counted_mean"]
    base = {"run": r["experiment"], "stage": r["stage"], "rate": r["requested_rate_per_s"], "real_class": real_class(r)}
    for k in METRICS:
        base[f"real_{k}"] = float(real_m[k])
    described = {**{k: settings[k] for k in SETTING_COLUMNS if k in settings}, "stage_file": r.get("stage_file", ""),
                 "tensor_parallel_size": int(r["tensor_parallel_size"]), "profile": profile["source"],
                 "weights": "", "skipped": settings["skipped"]}
    cfg = point = None
    if not described["skipped"]:
        try:
            point = stage_point(r, max_stage_s, settings, profile)
            cfg = resolve_point(point)
            described["weights"] = cfg.deployment.weight_format(cfg.model)
        except (ConfigError, CatalogError, ValueError) as e:
            described["skipped"] = str(e).splitlines()[0]
    rows = []
    for name in models:
        row = {**base, "cost_model": name}
        why = described["skipped"]
        if not why:
            t0 = time.perf_counter()
            try:
                res = simulate(_with_profile(cfg, name), 0)
            except (SimulationError, ConfigError, CatalogError, ValueError) as e:
                why = str(e).splitlines()[0]
        if why:
            rows.append({**row, **described, "skipped": why})
            say(f"{r['experiment']} {r['stage']} {name}: skipped: {why}")
            continue
        dur = point["workload"]["num_requests"] / point["workload"]["arrival"]["rate_per_s"]
        m = sim_metrics(res.requests, None)
        # throughput over the stage's sending window, like the client's (output tokens finished / span)
        m["throughput_tok_s"] = float(res.requests.loc[res.requests["status"] == "finished", "output_tokens"].sum()
                                      / max(dur, res.requests["finish_s"].max() - res.requests["arrival_s"].min()))
        row.update({"cost_model_kind": res.resolved.get("cost_model", {}).get("kind", "?")
                    if isinstance(res.resolved.get("cost_model"), dict) else "?",
                    "num_requests": point["workload"]["num_requests"], "sim_wall_s": round(time.perf_counter() - t0, 1),
                    "sim_class": "saturated" if saturated(m["ttft_p99_ms"]) else "sustained"})
        for k in METRICS:
            row[f"sim_{k}"] = m[k]
            row[f"err_{k}"] = m[k] / float(real_m[k]) - 1 if real_m[k] else math.nan
        rows.append({**row, **described})
        say(f"{r['experiment']} {r['stage']} {name} on {settings['gpu']}: per-token {m['per_token_ms']:.2f} ms "
            f"(real {real_m['per_token_ms']:.2f}), TTFT mean {m['ttft_mean_ms']:.0f} ms "
            f"(real {real_m['ttft_mean_ms']:.0f}), {row['sim_class']} (real {row['real_class']}), "
            f"{row['sim_wall_s']} s")
    return rows


def _with_profile(cfg, name: str):
    import dataclasses
    return dataclasses.replace(cfg, profile="roofline" if name == "roofline" else None)


def read_llmservingsim_runs(shared: Path) -> list[tuple]:
    """(folder, run, its decode-only ticks or None, its busy ticks or None) for every LLMServingSim run folder
    under real-runs/llmservingsim/, in name order, all read before minutes of replay: a file that cannot be
    read raises fidelity.realruns.RealRunError, one line naming it."""
    from fidelity import run_ticks
    from fidelity.llmservingsim import read_run
    out = []
    for d in sorted(p for p in (shared / LSS_DIR).iterdir() if (p / "vllm_requests.jsonl").exists()):
        run = read_run(d)
        ts = run_ticks.timeseries_of_run(run)
        out.append((d, run, None if ts is None else run_ticks.decode_ticks(run.requests, ts),
                    None if ts is None else run_ticks.busy_ticks(run.requests, ts)))
    return out


def llmservingsim_runs(shared: Path, lss_runs: list[tuple], models: list[str],
                       work: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs.csv's rows: each run of `lss_runs` (read_llmservingsim_runs) replayed with each cost model, beside
    the peer's errors; step_curves.csv's: each cost model's price of the decode-only steps the run's own
    ticks show, by batch; busy_ticks.csv's: its price of every busy tick's work, prefill included, against
    the tick's length (fidelity/run_ticks.py), for the runs without DP)."""
    import dataclasses
    from experiments.simulate import as_scheduled, point_cost_model
    from fidelity.llmservingsim import host_interconnect, peer_errors, replay_point
    from fidelity.realruns import replay, replay_config
    rows, curves, busy = [], [], []
    for d, run, ticks, busy_ticks in lss_runs:
        real = run.requests
        real_m = _lss_metrics(real)
        peer = peer_errors(d)
        point = replay_point(run, run.meta["model_id"])
        cfg = replay_config(run, point)
        profile = layer_profile(shared, d.name, work)
        host = host_staged_point(run, run.meta["model_id"])
        (gpus, catalog_kind), host_kind = _linked_gpus(point), host_interconnect(run)
        for name in models + (["layer-profile"] if profile else []) + (["roofline-pcie_host"] if host else []):
            t0 = time.perf_counter()
            if name == "roofline-pcie_host":
                cfg_used, chosen = replay_config(run, host), "roofline"
            else:
                cfg_used, chosen = cfg, {"roofline": "roofline", "default": None, "layer-profile": profile}[name]
            if chosen is not None:
                cfg_used = dataclasses.replace(cfg_used, profile=chosen)
            model = point_cost_model(cfg_used)   # one model for the replay and the ticks' steps
            res = replay(run, cfg_used, cost_model=model)
            m = _lss_metrics(res.requests)
            described = res.resolved.get("cost_model") if isinstance(res.resolved.get("cost_model"), dict) else {}
            kind = "pcie_host" if name == "roofline-pcie_host" else catalog_kind
            row = {"run": d.name, "cost_model": name, "cost_model_kind": described.get("kind", "?"),
                   "gpu": described.get("gpu", "?"), "vllm_version": run.meta.get("vllm_version", ""),
                   # the GPU-to-GPU path this row priced, and whether it is the one the run's host most
                   # likely had (fidelity.llmservingsim.host_interconnect; a one-GPU run crosses none)
                   "interconnect": kind, "host_as_run": gpus < 2 or host_kind in (None, kind),
                   "num_requests": len(real), "sim_wall_s": round(time.perf_counter() - t0, 1)}
            for k in real_m:
                row[f"real_{k}"], row[f"sim_{k}"] = real_m[k], m[k]
                row[f"err_{k}"] = m[k] / real_m[k] - 1 if real_m[k] else math.nan
                row[f"peer_err_{k}"] = peer.get(k, math.nan)
            rows.append(row)
            say(f"{d.name} {name}: TPOT mean {m['tpot_mean_ms']:.2f} ms (real {real_m['tpot_mean_ms']:.2f}), "
                f"TTFT mean {m['ttft_mean_ms']:.0f} ms (real {real_m['ttft_mean_ms']:.0f}), {row['sim_wall_s']} s")
            if ticks is not None and len(ticks.table):
                curves.append(step_curve(d.name, name, ticks, as_scheduled(cfg_used, model),
                                         point.get("data_parallel_size", 1)))
            if busy_ticks is not None and len(busy_ticks.table) and point.get("data_parallel_size", 1) == 1:
                busy.append(busy_tick_rows(d.name, name, busy_ticks, as_scheduled(cfg_used, model),
                                           int(cfg_used.policy.max_num_batched_tokens)))
    return (pd.DataFrame(rows), pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
            pd.concat(busy, ignore_index=True) if busy else pd.DataFrame())


def busy_tick_rows(run: str, cost_model: str, ticks, model, token_budget: int) -> pd.DataFrame:
    """One cost model's price of a run's busy ticks against their length (fidelity.run_ticks.busy_summary):
    the ticks without prefill, those with, all."""
    from fidelity import run_ticks
    priced = [run_ticks.price_busy_tick(model, t.contexts, t.prefill, t.steps, token_budget)
              for t in ticks.table.itertuples()]
    out = run_ticks.busy_summary(ticks.table, priced)
    out.insert(0, "cost_model", cost_model)
    out.insert(0, "run", run)
    return out


def step_curve(run: str, cost_model: str, ticks, model, dp: int) -> pd.DataFrame:
    """One cost model's price of a run's decode-only ticks, by batch (fidelity.run_ticks.batch_curve): `model`
    as the replay used it (experiments.simulate's choice and scheduling)."""
    from fidelity import run_ticks
    sim = run_ticks.price_ticks(model, ticks.table, dp)
    curve = run_ticks.batch_curve(ticks.table, sim)
    overall = {"batch_bin": "all", "ticks": len(sim), "batch_mean": ticks.table["batch"].mean(),
               "context_mean": ticks.table["context_mean"].mean(),
               "real_step_ms": ticks.table["real_step_s"].mean() * 1e3, "sim_step_ms": sim.mean() * 1e3}
    overall["err"] = overall["sim_step_ms"] / overall["real_step_ms"] - 1
    curve = pd.concat([curve, pd.DataFrame([overall])], ignore_index=True)
    curve.insert(0, "cost_model", cost_model)
    curve.insert(0, "run", run)
    curve["median_abs_err_ticks"] = float(np.median(np.abs(sim / ticks.table["real_step_s"].to_numpy() - 1)))
    curve["clock_offset_s"], curve["running_mismatch"] = ticks.offset_s, round(ticks.running_mismatch, 3)
    return curve


def _linked_gpus(point: dict) -> tuple[int, str]:
    """(the GPUs a replay point's steps join, the interconnect kind its GPU has): a DP run counts too, its EP
    all-gathers and reduce-scatters crossing the same link."""
    from costmodels.gpuspec import parse_gpu
    return (point["tensor_parallel_size"] * point.get("data_parallel_size", 1),
            parse_gpu(point["hardware"]).interconnect_kind)


def host_staged_point(run, model: str) -> dict | None:
    """The replay point with the run's GPU described as having no GPU peer-to-peer path (`interconnect_kind:
    pcie_host`, costmodels/collectives.py), for a multi-GPU run on a GPU the catalog gives P2P over PCIe:
    LLMServingSim's calibration of its two RTX PRO 6000 Server measured that path (a 16 GB/s all-reduce)
    until its host's ACS and IOMMU were turned off, after its runs (fidelity.llmservingsim.HOST_P2P_FROM):
    the path their host most likely had. The catalog's P2P row is replayed too. None for
    single-GPU runs and other interconnects; a DP run counts (its EP all-gathers and reduce-scatters cross
    the same link)."""
    from fidelity.llmservingsim import gpu_of, replay_point
    point = replay_point(run, model)
    gpus, kind = _linked_gpus(point)
    if gpus < 2 or kind != "pcie":
        return None
    gpu = gpu_of(run)
    hw = {**(gpu if isinstance(gpu, dict) else {"base": gpu, "name": gpu}), "interconnect_kind": "pcie_host"}
    hw["name"] = f"{hw['name']}-pcie_host"
    return replay_point(run, model, hardware=hw)


def layer_profile(shared: Path, run_name: str, work: Path) -> str | None:
    """A profile fitted to vLLM's own per-layer kernel timings on the run's GPU and model
    (calibration.import_llmservingsim + calibration.fit), when the profiler folder has them; None else."""
    folder = shared / LSS_DIR / "profiler_perf" / f"{run_name}_bf16"
    if not (folder / "meta.yaml").exists():
        return None
    from calibration import import_llmservingsim
    out = work / f"{run_name}-layers"
    path = work / f"{run_name}-layers.json"
    if not path.exists():
        with contextlib.redirect_stdout(io.StringIO()):
            rc = import_llmservingsim.main([str(folder), "--out", str(out), "--fit", str(path)])
        if rc != 0:
            return None
    return str(path)


def _lss_metrics(req: pd.DataFrame) -> dict:
    """The peer's metrics (validation_summary.txt): TTFT, TPOT and latency (E2E) mean/p50/p99, ms."""
    fin = req[req["status"] == "finished"]
    ttft = (fin["first_token_s"] - fin["arrival_s"]) * 1e3
    e2e = (fin["finish_s"] - fin["arrival_s"]) * 1e3
    tpot = ((fin["finish_s"] - fin["first_token_s"]) * 1e3 / (fin["output_tokens"] - 1)).where(fin["output_tokens"] > 1)
    out = {}
    for k, v in (("ttft", ttft), ("tpot", tpot.dropna()), ("e2e", e2e)):
        out[f"{k}_mean_ms"] = float(v.mean())
        out[f"{k}_p50_ms"] = float(v.median())
        out[f"{k}_p99_ms"] = float(np.percentile(v, 99))
    return out


# The per-file summary's columns: the headline errors only
BY_FILE = ("stage_file", "gpu", "cost_model")
BY_FILE_COLUMNS = BY_FILE + ("stages", "wrong_class") + tuple(
    f"{k} {s}|err|" for k in ("per_token_ms", "ttft_mean_ms", "e2e_mean_ms") for s in ("median", "p90"))


def replayed(stages: pd.DataFrame) -> pd.DataFrame:
    """The rows that were simulated (not skipped)."""
    if "skipped" not in stages.columns:
        return stages
    why = stages["skipped"]
    return stages[why.isna() | (why.astype(str) == "")]


def summary(stages: pd.DataFrame, by: tuple[str, ...] = ("cost_model",)) -> pd.DataFrame:
    """Median and p90 |error| per group (cost model; or stage file, GPU and cost model) and metric over the
    sustained real stages, and the count of stages on the wrong side of the knee (over every stage); skipped
    rows are left out."""
    rows = []
    for key, g in replayed(stages).groupby(list(by), sort=False):
        ok = g[g["real_class"] == "sustained"]
        row = {**dict(zip(by, key if isinstance(key, tuple) else (key,))), "stages": len(g),
               "wrong_class": int(((g["real_class"] != g["sim_class"]) & (g["real_class"] != "unknown")).sum())}
        for k in METRICS:
            e = ok[f"err_{k}"].abs().dropna()
            row[f"{k} median|err|"] = float(e.median()) if len(e) else math.nan
            row[f"{k} p90|err|"] = float(np.percentile(e, 90)) if len(e) else math.nan
            row[f"{k} median err"] = float(ok[f"err_{k}"].median()) if len(e) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _percent(s: pd.DataFrame) -> pd.DataFrame:
    t = s.copy()
    for c in t.columns:
        if "err" in c:
            t[c] = t[c].map(lambda v: "" if pd.isna(v) else f"{v:+.1%}" if "median err" in c else f"{v:.1%}")
    # a bare | in a header cell would split it in two and break the Markdown table
    return t.rename(columns=lambda c: c.replace("|", "\\|"))


def report(stages: pd.DataFrame, runs: pd.DataFrame, out: Path, curves: pd.DataFrame | None = None,
           busy: pd.DataFrame | None = None) -> str:
    from experiments.report import md_table
    lines = ["# GPU fidelity: the default cost model against real vLLM runs", ""]
    if len(stages):
        done = replayed(stages)
        versions = ", ".join(dict.fromkeys(stages["vllm_version"].dropna().astype(str))) or "?"
        gpus = ", ".join(dict.fromkeys(done["gpu"].astype(str))) or "none replayed"
        lines += [f"## vLLM {versions} load stages ({gpus})", "",
                  "Errors are simulated / real - 1; summaries over the sustained real stages (the saturated ones "
                  "show where the knee is, not a latency to match). TTFT includes the serving front end "
                  "(costmodels/frontend.py), as a client measures it.", ""]
        if len(done):
            lines += [md_table(_percent(summary(stages))), "",
                      "By stage file and GPU:", "",
                      md_table(_percent(summary(stages, BY_FILE)[list(BY_FILE_COLUMNS)])), ""]
        skipped = stages[~stages.index.isin(done.index)].drop_duplicates(["stage_file", "run", "stage", "skipped"])
        if len(skipped):
            lines += ["Stages not replayed:", ""]
            lines += [f"- {s.stage_file} {s.run} {s.stage}: skipped: {s.skipped}" for s in skipped.itertuples()]
            lines += [""]
        cols = ["run", "stage"] + (["gpu"] if done["stage_file"].nunique() > 1 else []) + [
            "rate", "cost_model", "real_class", "sim_class"]
        for k in METRICS:
            cols += [f"real_{k}", f"sim_{k}"]
        if len(done):
            lines += [md_table(done[cols].round(1)), ""]
    if len(runs):
        cols = ["run", "cost_model"]
        keys = [c[5:] for c in runs.columns if c.startswith("real_")]
        t = runs[cols].copy()
        for k in keys:
            t[f"{k} err"] = runs[f"err_{k}"].map(lambda v: f"{v:+.0%}")
            t[f"{k} peer"] = runs[f"peer_err_{k}"].map(lambda v: "" if pd.isna(v) else f"{v:+.0%}")
        lines += ["## vLLM 0.19.0 runs (LLMServingSim's set)", "",
                  "Error of this simulator and of the peer simulator (validation_summary.txt) on the same runs.", "",
                  md_table(t), "",
                  "Fitted to one run and applied to the others (fidelity/request_fit.py): cross_fit.md.", ""]
    if curves is not None and len(curves):
        lines += ["### Decode-only steps, as each run's own 1 s ticks show them", "",
                  "Each tick in which nothing was prefilled, with a KV pool under 95% full and the requests' "
                  "decoding count agreeing with vLLM's stat logger, gives one real step (tick x requests "
                  "decoding / tokens generated), priced by each cost model at the same requests' contexts, "
                  "outside any scheduling (fidelity/run_ticks.py; step_curves.csv). Real step and each cost "
                  "model's error, by requests decoding:", "",
                  md_table(step_curve_table(curves)), ""]
    if busy is not None and len(busy):
        lines += ["### Every busy tick, prefill included", "",
                  "Each usable tick (as above, prefill or not) priced whole against its length: the steps it took "
                  "(its tokens over the requests decoding), with the prompt tokens each prefilling request "
                  "computed in it (spread over its span from first scheduling to first token) packed into steps "
                  "as vLLM fills its token budget (fidelity/run_ticks.py; busy_ticks.csv; not for DP runs, whose "
                  "ranks' prefills are not recorded). The prompt tokens priced beside the logger's own count, "
                  "and each cost model's error: median over the ticks, and of their summed time:", "",
                  md_table(busy_tick_table(busy)), ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def busy_tick_table(busy: pd.DataFrame) -> pd.DataFrame:
    """busy_ticks.csv as one row per run and kind of tick: ticks, mean batch, prompt tokens a tick (priced
    and logged) and each cost model's median and summed-time errors."""
    keys = ["run", "ticks"]
    base = busy.drop_duplicates(keys)[keys + ["n", "batch_mean", "prefill_tokens_per_tick",
                                              "logged_prompt_tokens_per_tick"]]
    errs = busy.assign(err=[f"{m:+.1%} / {t:+.1%}" for m, t in zip(busy["median_err"], busy["time_err"])])
    errs = errs.pivot_table(index=keys, columns="cost_model", values="err", aggfunc="first", sort=False)
    return base.merge(errs.reset_index(), on=keys).round(
        {"batch_mean": 1, "prefill_tokens_per_tick": 0, "logged_prompt_tokens_per_tick": 0})


def step_curve_table(curves: pd.DataFrame) -> pd.DataFrame:
    """step_curves.csv as one row per run and batch bin: ticks, mean batch, real step (ms) and each cost
    model's error."""
    keys = ["run", "batch_bin"]
    base = curves.drop_duplicates(keys)[keys + ["ticks", "batch_mean", "context_mean", "real_step_ms"]]
    errs = curves.pivot_table(index=keys, columns="cost_model", values="err", aggfunc="first", sort=False)
    t = base.merge(errs.map(lambda v: "" if pd.isna(v) else f"{v:+.1%}").reset_index(), on=keys)
    return t.round({"batch_mean": 1, "context_mean": 0, "real_step_ms": 2})


def main(argv=None) -> int:
    ap = Parser(prog="python -m benchmarks.gpu_fidelity", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/gpu-fidelity", help="folder for stages.csv, runs.csv, report.md")
    ap.add_argument("--shared", default=None, help="the shared data folder (default: ../shared)")
    ap.add_argument("--models", default="roofline,default",
                    help="cost models, comma-separated: roofline (datasheet prior), default (what a plain run picks)")
    ap.add_argument("--max-stage-s", type=positive_float, default=600.0,
                    help="simulate at most this many seconds of each stage's arrivals (default 600)")
    ap.add_argument("--sets", default="h100,llmservingsim",
                    help="which sets: h100 (the stage files; also 'stages'), llmservingsim")
    ap.add_argument("--stages", action="append", default=[], metavar="FILE",
                    help="a stage file to replay besides real-runs/vllm-*-stages.csv (repeatable or comma-separated)")
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in ("roofline", "default")]
    if bad or not models:
        ap.error(f"argument --models: unknown cost model {(bad or [''])[0]!r}; expected roofline and/or default")
    sets = [{"stages": "h100"}.get(x, x) for x in a.sets.split(",") if x]
    if not sets or any(x not in ("h100", "llmservingsim") for x in sets):
        ap.error(f"argument --sets: expected h100 and/or llmservingsim, got {a.sets!r}")
    named = [f for arg in a.stages for f in arg.split(",") if f]
    try:
        out_dir(a.out)   # before minutes of replay
    except OutputError as e:
        ap.error(str(e))
    shared = shared_folder(ap, a.shared)
    if shared is None and not named:
        print("gpu_fidelity: no ../shared/real-runs beside the checkout: nothing to replay, skipped")
        return 0
    tables = []
    if "h100" in sets:
        try:   # every file read before minutes of replay: a bad one is one line
            tables = [read_stage_file(f) for f in stage_files(shared / "real-runs" if shared else None, named)]
        except StageFileError as e:
            ap.error(str(e))
    lss_runs = None
    if "llmservingsim" in sets and shared is not None and (shared / LSS_DIR).is_dir():
        from fidelity.realruns import RealRunError
        try:
            lss_runs = read_llmservingsim_runs(shared)
        except RealRunError as e:
            ap.error(str(e))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = runs = curves = busy = pd.DataFrame()
    with tempfile.TemporaryDirectory() as work:   # the layer profiles fitted for the LLMServingSim runs
        if tables:
            stages = file_stages(tables, models, a.max_stage_s, keep=out / "stages.csv")
            stages.to_csv(out / "stages.csv", index=False)   # the whole table at once: one dtype per column
        if lss_runs is not None:
            runs, curves, busy = llmservingsim_runs(shared, lss_runs, models, Path(work))
            runs.to_csv(out / "runs.csv", index=False)
            if len(curves):
                curves.to_csv(out / "step_curves.csv", index=False)
            if len(busy):
                busy.to_csv(out / "busy_ticks.csv", index=False)
            from benchmarks import gpu_cross_fit   # fit on one run, apply to the others: cross_fit.md
            fits, cross = gpu_cross_fit.cross_fit(shared)
            fits.to_csv(out / "cross_fit_params.csv", index=False)
            cross.to_csv(out / "cross_fit.csv", index=False)
            gpu_cross_fit.report(fits, cross, out)
    print(report(stages, runs, out, curves, busy))
    return 0


if __name__ == "__main__":
    run_main(main, kept="the stages replayed so far are in stages.csv under --out")
