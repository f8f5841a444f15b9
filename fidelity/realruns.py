"""Real serving runs read into one form, and replayed through our engine request for request.

A real run is what a benchmark client saw (per request: send time, lengths, token times) and, where the
engine was instrumented, what each engine step did and how long it took. Formats read:

- `fidelity.vllm_run` output: a run folder (runs/<point>-r<k>/) or the whole output folder (every run in
  it); steps, engine-side times and the point's configuration come with it;
- `vllm bench serve --save-result --save-detailed` JSON (input_lens, output_lens, start_times, ttfts, itls);
- GuideLLM benchmarks JSON (`guidellm benchmark --output-path x.json`): one run per benchmark (rate), from
  each successful request's start, first-token and last-token times (GuideLLM's own fields, old and new);
- an LLMServingSim run folder (vllm_requests.jsonl + vllm_meta.json; fidelity/llmservingsim.py);
- a generic per-request CSV: `arrival_s` (or submit_s / send_s / start_s), `prompt_tokens`, `output_tokens`,
  and `first_token_s` + `finish_s` (or last_token_s), or `ttft_s`/`ttft_ms` + `e2e_s`/`e2e_ms`, or
  `token_times_s` (space-separated, every token); absolute times are made relative to the first send.

Anything else, or requests without timestamps, is a one-line RealRunError naming the file.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from experiments.tables import has_table, read_itl_ms, read_table, table_path
from simcore.kvcache import num_usable_blocks
from simcore.metrics import requests_frame_from_columns, summarize
from simcore.request import RequestSpec


class RealRunError(ValueError):
    """A real-run file that cannot be read; the message names it and fits on one line."""


@dataclass
class RealRun:
    name: str                         # where it came from (file, or folder of a vllm_run run)
    format: str                       # vllm_run | vllm_bench | guidellm | csv
    requests: pd.DataFrame            # our request table (arrival_s = client send time, s from the run's start)
    itl_gaps_s: np.ndarray | None     # every gap between a request's consecutive tokens (None: not recorded)
    steps: pd.DataFrame | None = None  # engine steps: start_s, duration_s, prefill, decode, num_logits
    config: dict | None = None        # the sweep-style point it ran (vllm_run), else None
    point: str | None = None          # runs of one point (repeats) share this label
    meta: dict = field(default_factory=dict)

    @property
    def summary(self) -> dict:
        it = self.steps if self.steps is not None else pd.DataFrame(
            {"start_s": [], "duration_s": [], "prefill_tokens": [], "decode_tokens": [], "padding_tokens": [],
             "num_seqs": [], "num_preempted": [], "num_waiting": [], "num_running": [], "kv_blocks_used": []})
        gaps = self.itl_gaps_s if self.itl_gaps_s is not None else []
        return summarize(self.requests, it, gaps, max(1, num_usable_blocks(int(self.meta.get("num_gpu_blocks") or 2))))

    def specs(self) -> list[RequestSpec]:
        """The run's requests as our engine takes them: same send times, same lengths and priorities."""
        r = self.requests.sort_values(["arrival_s", "request_id"], kind="stable")
        prio = r["priority"] if "priority" in r else pd.Series(0, index=r.index)
        return [RequestSpec(int(i), float(a), int(p), int(o), None, None, int(q))
                for i, a, p, o, q in zip(r["request_id"], r["arrival_s"], r["prompt_tokens"], r["output_tokens"],
                                         prio)]


# ---- building the request table ----
def _table(path, request_id, arrival, prompt, output, first, last, status=None, priority=None) -> pd.DataFrame:
    n = len(arrival)
    arrival = np.asarray(arrival, dtype=float)
    if n == 0:
        raise RealRunError(f"{path}: no requests")
    first, last = np.asarray(first, dtype=float), np.asarray(last, dtype=float)
    if not np.isfinite(arrival).all():
        raise RealRunError(f"{path}: some requests lack a send/arrival time")
    ok = np.isfinite(first) & np.isfinite(last)
    if not ok.any():
        raise RealRunError(f"{path}: requests lack token timestamps (need first- and last-token times)")
    t0 = arrival.min()
    if status is None:
        status = np.where(ok, "finished", "rejected")
    cols = {"request_id": np.asarray(request_id, dtype=int), "replica_id": np.zeros(n, dtype=int),
            "arrival_s": arrival - t0, "prompt_tokens": np.asarray(prompt, dtype=int),
            "output_tokens": np.asarray(output, dtype=int), "admitted_s": np.full(n, np.nan),
            "first_token_s": first - t0, "finish_s": last - t0, "num_preemptions": np.zeros(n, dtype=int),
            "status": status, "reject_reason": [None if s == "finished" else "failed in the real run" for s in status],
            "priority": np.zeros(n, dtype=int) if priority is None else np.asarray(priority, dtype=int)}
    return requests_frame_from_columns(cols)


# ---- readers ----
def read_runs(path: str | Path) -> list[RealRun]:
    """Every real run at `path` (see the module docstring for the formats)."""
    p = Path(path)
    if not p.exists():
        raise RealRunError(f"{p}: no such run file or folder")
    if p.is_dir():
        from fidelity import llmservingsim
        if llmservingsim.is_run(p):   # LLMServingSim's bench/examples run folder
            return [llmservingsim.read_run(p)]
        if has_table(p, "requests") and (p / "summary.json").exists():
            return [_read_vllm_run(p)]
        dirs = sorted(d for d in (p / "runs").glob("*") if (d / "summary.json").exists()) if (p / "runs").is_dir() else []
        if not dirs:
            raise RealRunError(f"{p}: not a fidelity.vllm_run folder (no runs/*/summary.json or requests.csv)")
        return [_read_vllm_run(d) for d in dirs]
    suffix = p.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RealRunError(f"{p}: not valid JSON ({str(e).splitlines()[0]})") from None
        if isinstance(data, dict) and ("ttfts" in data or "input_lens" in data):
            return [_read_vllm_bench(p, data)]
        if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
            return _read_guidellm(p, data)
        raise RealRunError(f"{p}: unknown run format (expected vllm bench serve --save-detailed JSON with "
                           f"'ttfts'/'itls', or GuideLLM JSON with 'benchmarks')")
    if suffix == ".csv":
        return [_read_csv(p)]
    raise RealRunError(f"{p}: unknown run format (a fidelity.vllm_run folder, a .json from vllm bench serve "
                       f"or GuideLLM, or a per-request .csv)")


def _read_vllm_run(d: Path) -> RealRun:
    try:
        requests = read_table(d, "requests")
        summary = json.loads((d / "summary.json").read_text())
        config = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").exists() else None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise RealRunError(f"{d}: unreadable fidelity.vllm_run run ({e.__class__.__name__})") from None
    if isinstance(config, dict) and isinstance(config.get("model"), str) and not Path(config["model"]).exists():
        moved = d.parent.parent / "model" / "config.json"  # the output folder was moved: its own copy
        if moved.exists():
            config["model"] = str(moved)
    need = {"request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s"}
    if not need <= set(requests.columns):
        raise RealRunError(f"{table_path(d, 'requests')}: lacks {', '.join(sorted(need - set(requests.columns)))}")
    gaps = None
    if (d / "itl_gaps_ms.npy").exists():   # fidelity.vllm_run's every gap, in order
        gaps = np.load(d / "itl_gaps_ms.npy").astype(float) / 1e3
    elif has_table(d, "itl"):              # a simulated run saved by experiments.run: (gap, count) samples
        gaps = np.repeat(*read_itl_ms(d)) / 1e3
    steps = None
    if has_table(d, "iterations"):
        it = read_table(d, "iterations")
        if len(it) and {"prefill_json", "decode_json"} <= set(it.columns):
            it["prefill"] = [[tuple(x) for x in json.loads(v)] for v in it["prefill_json"]]
            it["decode"] = [json.loads(v) for v in it["decode_json"]]
            steps = it
    meta = {k: summary.get(k) for k in ("device", "vllm_version", "num_gpu_blocks", "repeat") if k in summary}
    meta["num_gpu_blocks"] = summary.get("num_gpu_blocks") or (config or {}).get("engine", {}).get("num_gpu_blocks", 1)
    label = f"{d.parent.parent.name}/{summary.get('point', d.name)}"  # e.g. "sat/p000-seed0": unique per folder
    return RealRun(str(d), "vllm_run", requests, gaps, steps, config, label, meta)


def _read_vllm_bench(p: Path, data: dict) -> RealRun:
    try:
        ttfts = np.asarray(data["ttfts"], dtype=float)
        itls = data["itls"]
        ins = np.asarray(data["input_lens"], dtype=int)
        outs = np.asarray(data["output_lens"], dtype=int)
    except KeyError as e:
        raise RealRunError(f"{p}: vllm bench serve JSON lacks {e.args[0]!r}: rerun it with --save-detailed") from None
    except (TypeError, ValueError) as e:
        raise RealRunError(f"{p}: vllm bench serve JSON has malformed per-request lists ({e})") from None
    starts = data.get("start_times")
    if starts is None:
        raise RealRunError(f"{p}: requests lack send times ('start_times'); rerun vllm bench serve with "
                           f"--save-detailed (vLLM >= 0.10)")
    starts = np.asarray(starts, dtype=float)
    errors = data.get("errors") or [""] * len(ins)
    if not (len(ttfts) == len(itls) == len(ins) == len(outs) == len(starts)):
        raise RealRunError(f"{p}: per-request lists of different lengths")
    gaps, last = [], []
    for s, t, itl, e in zip(starts, ttfts, itls, errors):
        ok = not e and t is not None and np.isfinite(t) and t > 0
        g = [float(x) for x in (itl or [])] if ok else []
        gaps.extend(g)
        last.append(s + t + sum(g) if ok else np.nan)
    first = np.where(np.array([not e for e in errors]) & (ttfts > 0), starts + ttfts, np.nan)
    req = _table(p, np.arange(len(ins)), starts, ins, outs, first, last)
    meta = {k: data.get(k) for k in ("model_id", "request_rate", "burstiness", "max_concurrency", "date", "backend")}
    return RealRun(str(p), "vllm_bench", req, np.asarray(gaps), None, None, p.stem, meta)


def _get(d: dict, *paths):
    for path in paths:
        v = d
        for k in path.split("."):
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None:
            return v
    return None


def _read_guidellm(p: Path, data: dict) -> list[RealRun]:
    runs = []
    for i, b in enumerate(data["benchmarks"]):
        reqs = _get(b, "requests.successful") or []
        if not reqs:
            continue
        start = [_get(r, "info.timings.request_start", "request_start_time", "start_time") for r in reqs]
        first = [_get(r, "info.timings.first_token_iteration", "first_token_time") for r in reqs]
        last = [_get(r, "info.timings.last_token_iteration", "last_token_time", "request_end_time", "end_time")
                for r in reqs]
        ttft = [_get(r, "time_to_first_token_ms") for r in reqs]
        first = [f if f is not None else (s + t / 1e3 if s is not None and t is not None else None)
                 for f, s, t in zip(first, start, ttft)]
        prompt = [_get(r, "prompt_tokens", "input_metrics.total_tokens") for r in reqs]
        output = [_get(r, "output_tokens", "output_metrics.total_tokens") for r in reqs]
        if any(v is None for v in start):
            raise RealRunError(f"{p}: benchmark {i}: requests lack a start time (request_start)")
        if any(v is None for v in prompt + output):
            raise RealRunError(f"{p}: benchmark {i}: requests lack prompt/output token counts")
        f = np.array([np.nan if v is None else v for v in first], dtype=float)
        la = np.array([np.nan if v is None else v for v in last], dtype=float)
        req = _table(p, np.arange(len(reqs)), start, prompt, output, f, la)
        strategy = _get(b, "args.strategy.type_", "config.strategy.type_", "scheduler.strategy.type_") or "?"
        rate = _get(b, "args.strategy.rate", "config.strategy.rate", "scheduler.strategy.rate")
        runs.append(RealRun(f"{p}#{i}", "guidellm", req, None, None, None, f"{p.stem}#{i}",
                            {"strategy": strategy, "rate": rate}))
    if not runs:
        raise RealRunError(f"{p}: GuideLLM JSON has no benchmark with successful requests")
    return runs


_ALIASES = {"arrival_s": ("arrival_s", "submit_s", "send_s", "start_s", "arrival_time"),
            "prompt_tokens": ("prompt_tokens", "input_tokens", "num_prompt_tokens"),
            "output_tokens": ("output_tokens", "num_output_tokens", "completion_tokens")}


def _read_csv(p: Path) -> RealRun:
    try:
        df = pd.read_csv(p)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise RealRunError(f"{p}: not a readable CSV ({str(e).splitlines()[0]})") from None
    cols = {}
    for want, names in _ALIASES.items():
        found = next((n for n in names if n in df.columns), None)
        if found is None:
            raise RealRunError(f"{p}: no {want} column (accepted: {', '.join(names)})")
        cols[want] = pd.to_numeric(df[found], errors="coerce").to_numpy(dtype=float)
    arrival = cols["arrival_s"]
    gaps = None
    if "first_token_s" in df.columns and ("finish_s" in df.columns or "last_token_s" in df.columns):
        first = pd.to_numeric(df["first_token_s"], errors="coerce").to_numpy(dtype=float)
        last = pd.to_numeric(df["finish_s" if "finish_s" in df.columns else "last_token_s"],
                             errors="coerce").to_numpy(dtype=float)
    elif any(c in df.columns for c in ("ttft_s", "ttft_ms")) and any(c in df.columns for c in ("e2e_s", "e2e_ms")):
        scale = lambda c: 1e-3 if c.endswith("_ms") else 1.0  # noqa: E731
        tc = "ttft_s" if "ttft_s" in df.columns else "ttft_ms"
        ec = "e2e_s" if "e2e_s" in df.columns else "e2e_ms"
        first = arrival + pd.to_numeric(df[tc], errors="coerce").to_numpy(dtype=float) * scale(tc)
        last = arrival + pd.to_numeric(df[ec], errors="coerce").to_numpy(dtype=float) * scale(ec)
    elif "token_times_s" in df.columns:
        times = [np.array([float(x) for x in str(v).split()]) if isinstance(v, str) and v.strip() else np.array([])
                 for v in df["token_times_s"]]
        first = np.array([t[0] if len(t) else np.nan for t in times])
        last = np.array([t[-1] if len(t) else np.nan for t in times])
        gaps = np.concatenate([np.diff(t) for t in times]) if times else np.array([])
    else:
        raise RealRunError(f"{p}: requests lack token timestamps (need first_token_s + finish_s, ttft_s + e2e_s, "
                           f"or token_times_s columns)")
    bad = ~np.isfinite(cols["prompt_tokens"]) | ~np.isfinite(cols["output_tokens"])
    if bad.any():
        raise RealRunError(f"{p}: line {int(np.flatnonzero(bad)[0]) + 2}: prompt/output tokens not a number")
    prio = pd.to_numeric(df["priority"], errors="coerce").fillna(0).to_numpy() if "priority" in df.columns else None
    req = _table(p, np.arange(len(df)), arrival, cols["prompt_tokens"], cols["output_tokens"], first, last,
                 priority=prio)
    return RealRun(str(p), "csv", req, gaps, None, None, p.stem, {})


# ---- replay through our engine ----
def replay_config(run: RealRun, point: dict | None):
    """The PointConfig a run is replayed with: `point` (a sweep-style mapping) or the run's own, with the
    workload replaced by open-loop arrivals at the run's send times."""
    from experiments.config import ConfigError, resolve_point
    raw = point if point is not None else run.config
    if raw is None:
        raise RealRunError(f"{run.name}: no engine configuration recorded with this run; give --config POINT.yaml")
    raw = json.loads(json.dumps({k: v for k, v in raw.items() if k not in ("grid", "seeds", "search", "capacity")}))
    n = len(run.requests)
    if isinstance(raw.get("engine"), dict) and raw["engine"].get("fast_path") == "off":
        raw["engine"]["fast_path"] = "auto"  # the same results (experiments/fast.py), much faster replays
    raw["workload"] = {"num_requests": n, "arrival": {"process": "poisson", "rate_per_s": math.inf},
                       "prompt_tokens": {"dist": "fixed", "value": 1}, "output_tokens": {"dist": "fixed", "value": 1}}
    try:
        return resolve_point(raw)
    except ConfigError as e:
        raise RealRunError(f"{run.name}: {e}") from None


def replay(run: RealRun, cfg, profile: str | None = None, cost_model=None):
    """Simulate the run's exact requests (experiments.simulate, the one wiring) with `profile` (a path,
    shipped name or "roofline"; None: the config's own) or an explicit `cost_model` value."""
    from experiments.simulate import simulate
    if profile is not None:
        cfg = dataclasses.replace(cfg, profile=profile)
    return simulate(cfg, 0, specs=run.specs(), cost_model=cost_model)
