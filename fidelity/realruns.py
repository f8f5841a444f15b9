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

Anything else, requests without timestamps, or values no served request can have (fidelity/runchecks.py)
is a one-line RealRunError naming the file, and the field and row where one is wrong.
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
from fidelity.runchecks import (RealRunError, check_gaps, check_requests, csv_line, csv_numbers, numbers,
                                request_row)
from simcore.kvcache import num_usable_blocks
from simcore.metrics import requests_frame_from_columns, summarize
from simcore.request import RequestSpec


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
def _table(path, request_id, arrival, prompt, output, first, last, status=None, priority=None,
           row=request_row) -> pd.DataFrame:
    arrival = numbers(path, "send time (s)", arrival, row)
    prompt, output = numbers(path, "prompt tokens", prompt, row), numbers(path, "output tokens", output, row)
    first, last = numbers(path, "first-token time (s)", first, row), numbers(path, "last-token time (s)", last, row)
    n = len(arrival)
    if n == 0:
        raise RealRunError(f"{path}: no requests")
    if not len(prompt) == len(output) == len(first) == len(last) == n:
        raise RealRunError(f"{path}: per-request fields of different lengths")
    ok = np.isfinite(first) & np.isfinite(last)
    check_requests(path, arrival, prompt, output, first, last, row)
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
    if not p.is_dir() and not p.is_file():   # a pipe or a device would block the read
        raise RealRunError(f"{p}: not a regular file or folder")
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
    if not isinstance(summary, dict):
        raise RealRunError(f"{d / 'summary.json'}: expected a JSON object, got a JSON {type(summary).__name__}")
    if config is not None and not isinstance(config, dict):
        raise RealRunError(f"{d / 'config.yaml'}: expected a mapping (the point's configuration)")
    if isinstance(config, dict) and isinstance(config.get("model"), str) and not Path(config["model"]).exists():
        moved = d.parent.parent / "model" / "config.json"  # the output folder was moved: its own copy
        if moved.exists():
            config["model"] = str(moved)
    need = {"request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s"}
    if not need <= set(requests.columns):
        raise RealRunError(f"{table_path(d, 'requests')}: lacks {', '.join(sorted(need - set(requests.columns)))}")
    _check_request_table(table_path(d, "requests"), requests)
    gaps = None
    if (d / "itl_gaps_ms.npy").exists():   # fidelity.vllm_run's every gap, in order
        try:
            gaps = np.load(d / "itl_gaps_ms.npy", allow_pickle=False).astype(float).ravel() / 1e3
        except (OSError, ValueError, TypeError) as e:
            raise RealRunError(f"{d / 'itl_gaps_ms.npy'}: unreadable ({e.__class__.__name__})") from None
        check_gaps(d / "itl_gaps_ms.npy", "gap", gaps, lambda j: f"gap {j}")
    elif has_table(d, "itl"):              # a simulated run saved by experiments.run: (gap, count) samples
        gaps = np.repeat(*read_itl_ms(d)) / 1e3
    steps = None
    if has_table(d, "iterations"):
        it = read_table(d, "iterations")
        if len(it) and {"prefill_json", "decode_json"} <= set(it.columns):
            path = table_path(d, "iterations")
            for col in ("start_s", "duration_s"):
                if col in it.columns:
                    x = csv_numbers(path, it, col, lambda i: f"row {i}")
                    if not (np.isfinite(x) & (x >= 0)).all():
                        i = int(np.flatnonzero(~(np.isfinite(x) & (x >= 0)))[0])
                        raise RealRunError(f"{path}: row {i}: {col}: expected seconds >= 0, got {x[i]:g}")
            it["prefill"] = [[tuple(x) for x in v] for v in _json_lists(path, it, "prefill_json", 2)]
            it["decode"] = _json_lists(path, it, "decode_json", 0)
            steps = it
    meta = {k: summary.get(k) for k in ("device", "vllm_version", "num_gpu_blocks", "repeat") if k in summary}
    meta["num_gpu_blocks"] = summary.get("num_gpu_blocks") or (config or {}).get("engine", {}).get("num_gpu_blocks", 1)
    label = f"{d.parent.parent.name}/{summary.get('point', d.name)}"  # e.g. "sat/p000-seed0": unique per folder
    return RealRun(str(d), "vllm_run", requests, gaps, steps, config, label, meta)


def _check_request_table(path: Path, requests: pd.DataFrame) -> None:
    """A saved request table holds numbers in its time and token columns, and requests that can be."""
    row = lambda i: f"row {i}"  # noqa: E731
    cols = {c: csv_numbers(path, requests, c, row)
            for c in ("arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s")}
    check_requests(path, cols["arrival_s"], cols["prompt_tokens"], cols["output_tokens"], cols["first_token_s"],
                   cols["finish_s"], row)


def _json_lists(path: Path, table: pd.DataFrame, column: str, pair: int) -> list[list]:
    """A JSON column of per-step lists: of [new, cached] token pairs (`pair` 2) or of numbers (0)."""
    out = []
    for i, v in enumerate(table[column]):
        try:
            x = json.loads(v)
        except (TypeError, ValueError):
            raise RealRunError(f"{path}: row {i}: {column}: not valid JSON ({str(v)[:40]!r})") from None
        items = x if isinstance(x, list) else None
        ok = items is not None and all(
            (isinstance(e, list) and len(e) == pair and all(isinstance(n, (int, float)) and n >= 0 for n in e))
            if pair else (isinstance(e, (int, float)) and not isinstance(e, bool) and e >= 0) for e in items)
        if not ok:
            want = "[[new, cached], ...] token counts" if pair else "[context, ...] token counts"
            raise RealRunError(f"{path}: row {i}: {column}: expected a JSON list {want}, got {str(v)[:40]!r}")
        out.append(x)
    return out


def _read_vllm_bench(p: Path, data: dict) -> RealRun:
    for key in ("ttfts", "itls", "input_lens", "output_lens"):
        if key not in data:
            raise RealRunError(f"{p}: vllm bench serve JSON lacks {key!r}: rerun it with --save-detailed")
    ttfts = numbers(p, "ttfts", data["ttfts"], unit="seconds")
    ins, outs = numbers(p, "input_lens", data["input_lens"]), numbers(p, "output_lens", data["output_lens"])
    itls = data["itls"]
    if not isinstance(itls, list):
        raise RealRunError(f"{p}: itls: expected a list of per-request lists of gaps (s), got "
                           f"{type(itls).__name__}")
    starts = data.get("start_times")
    if starts is None:
        raise RealRunError(f"{p}: requests lack send times ('start_times'); rerun vllm bench serve with "
                           f"--save-detailed (vLLM >= 0.10)")
    starts = numbers(p, "start_times", starts, unit="seconds (a number, not a date)")
    errors = data.get("errors") or [""] * len(ins)
    if not isinstance(errors, list) or not all(e is None or isinstance(e, str) for e in errors):
        raise RealRunError(f"{p}: errors: expected a list of strings (empty for a request that succeeded)")
    if not (len(ttfts) == len(itls) == len(ins) == len(outs) == len(starts) == len(errors)):
        raise RealRunError(f"{p}: per-request lists of different lengths")
    if (ttfts < 0).any():
        i = int(np.flatnonzero(ttfts < 0)[0])
        raise RealRunError(f"{p}: request {i}: ttfts: a negative time to first token ({ttfts[i]:g} s)")
    gaps, last = [], []
    for i, (s, t, itl, e) in enumerate(zip(starts, ttfts, itls, errors)):
        ok = not e and np.isfinite(t) and t > 0
        if ok and itl is not None and not isinstance(itl, list):
            raise RealRunError(f"{p}: request {i}: itls: expected a list of gaps (s), got {str(itl)[:40]!r}")
        g = numbers(p, "itls", itl or [], lambda j: f"request {i} gap {j}", False, "seconds") if ok else np.array([])
        check_gaps(p, "itls", g, lambda j: f"request {i} gap {j}")
        gaps.extend(g.tolist())
        last.append(s + t + g.sum() if ok else np.nan)
    first = np.where(np.array([not e for e in errors], dtype=bool) & (ttfts > 0), starts + ttfts, np.nan)
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
        if not isinstance(b, dict):
            raise RealRunError(f"{p}: benchmarks[{i}]: expected an object, got {type(b).__name__}")
        reqs = _get(b, "requests.successful") or []
        if not isinstance(reqs, list) or not all(isinstance(r, dict) for r in reqs):
            raise RealRunError(f"{p}: benchmarks[{i}].requests.successful: expected a list of request objects")
        if not reqs:
            continue
        start = [_get(r, "info.timings.request_start", "request_start_time", "start_time") for r in reqs]
        first = [_get(r, "info.timings.first_token_iteration", "first_token_time") for r in reqs]
        last = [_get(r, "info.timings.last_token_iteration", "last_token_time", "request_end_time", "end_time")
                for r in reqs]
        ttft = [_get(r, "time_to_first_token_ms") for r in reqs]
        row = lambda j, i=i: f"benchmark {i} request {j}"  # noqa: E731
        start_s = numbers(p, "request_start", start, row, unit="seconds (a number, not a date)")
        ttft_s = numbers(p, "time_to_first_token_ms", ttft, row) / 1e3
        first = [f if f is not None else s + t for f, s, t in zip(first, start_s, ttft_s)]
        prompt = [_get(r, "prompt_tokens", "input_metrics.total_tokens") for r in reqs]
        output = [_get(r, "output_tokens", "output_metrics.total_tokens") for r in reqs]
        if any(v is None for v in start):
            raise RealRunError(f"{p}: benchmark {i}: requests lack a start time (request_start)")
        if any(v is None for v in prompt + output):
            raise RealRunError(f"{p}: benchmark {i}: requests lack prompt/output token counts")
        f = numbers(p, "first_token_iteration", first, row, unit="seconds")
        la = numbers(p, "last_token_iteration", last, row, unit="seconds")
        req = _table(p, np.arange(len(reqs)), start, prompt, output, f, la, row=row)
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
        cols[want] = csv_numbers(p, df, found)
    arrival = cols["arrival_s"]
    gaps = None
    if "first_token_s" in df.columns and ("finish_s" in df.columns or "last_token_s" in df.columns):
        first = csv_numbers(p, df, "first_token_s")
        last = csv_numbers(p, df, "finish_s" if "finish_s" in df.columns else "last_token_s")
    elif any(c in df.columns for c in ("ttft_s", "ttft_ms")) and any(c in df.columns for c in ("e2e_s", "e2e_ms")):
        scale = lambda c: 1e-3 if c.endswith("_ms") else 1.0  # noqa: E731
        tc = "ttft_s" if "ttft_s" in df.columns else "ttft_ms"
        ec = "e2e_s" if "e2e_s" in df.columns else "e2e_ms"
        first = arrival + csv_numbers(p, df, tc) * scale(tc)
        last = arrival + csv_numbers(p, df, ec) * scale(ec)
    elif "token_times_s" in df.columns:
        times = [_token_times(p, v, i) for i, v in enumerate(df["token_times_s"])]
        first = np.array([t[0] if len(t) else np.nan for t in times])
        last = np.array([t[-1] if len(t) else np.nan for t in times])
        gaps = np.concatenate([np.diff(t) for t in times]) if times else np.array([])
        for i, t in enumerate(times):
            check_gaps(p, "token_times_s", np.diff(t), lambda j, i=i: f"{csv_line(i)} token {j + 1}")
    else:
        raise RealRunError(f"{p}: requests lack token timestamps (need first_token_s + finish_s, ttft_s + e2e_s, "
                           f"or token_times_s columns)")
    prio = pd.to_numeric(df["priority"], errors="coerce").fillna(0).to_numpy() if "priority" in df.columns else None
    req = _table(p, np.arange(len(df)), arrival, cols["prompt_tokens"], cols["output_tokens"], first, last,
                 priority=prio, row=csv_line)
    return RealRun(str(p), "csv", req, gaps, None, None, p.stem, {})


def _token_times(p: Path, cell, i: int) -> np.ndarray:
    """One token_times_s cell: space-separated seconds, every token's arrival."""
    if not isinstance(cell, str) or not cell.strip():
        if isinstance(cell, (int, float)) and np.isfinite(cell):
            return np.array([float(cell)])   # a one-token answer: pandas reads the lone time as a number
        return np.array([])
    try:
        return np.array([float(x) for x in cell.split()])
    except ValueError:
        raise RealRunError(f"{p}: {csv_line(i)}: token_times_s: expected space-separated seconds, got "
                           f"{cell[:40]!r}") from None


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


# A run whose times are vLLM's engine-core stamps (`meta["clock"]`): its clock starts when the engine core
# queued each request, between its steps (simcore.metrics.engine_core_view), not when it was sent.
ENGINE_CORE_CLOCK = "engine_core"
LATENCY_KEYS = ("ttft_", "e2e_", "queue_")


def replay(run: RealRun, cfg, profile: str | None = None, cost_model=None):
    """Simulate the run's exact requests (experiments.simulate, the one wiring) with `profile` (a path,
    shipped name or "roofline"; None: the config's own) or an explicit `cost_model` value. For a run timed
    on vLLM's engine-core clock the simulated requests are measured the same way: their TTFT, E2E and
    queue time from when the simulated engine would have queued them (simcore.metrics.engine_core_view)."""
    from experiments.simulate import simulate
    from simcore.metrics import engine_core_view
    if profile is not None:
        cfg = dataclasses.replace(cfg, profile=profile)
    res = simulate(cfg, 0, specs=run.specs(), cost_model=cost_model)
    if run.meta.get("clock") != ENGINE_CORE_CLOCK:
        return res
    requests = engine_core_view(res.requests, res.iterations)
    again = summarize(requests, res.iterations, res.itl_gaps_s, 1)
    summary = {**res.summary, **{k: v for k, v in again.items() if k.startswith(LATENCY_KEYS)}}
    return dataclasses.replace(res, requests=requests, summary=summary)
