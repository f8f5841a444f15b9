"""How much of one API-server process a request and a streamed token take when many streams share it:
`vllm serve`'s front end under concurrent load (benchmarks/frontend_latency.py measures one request at a time).

    python -m benchmarks.frontend_load --out DIR [--streams 50,200] [--outputs 1,8,32] [--repeats 2]

Starts `vllm serve` (vLLM's CPU build; the same tiny Llama with random weights and a tokenizer trained here
as benchmarks.frontend_latency, room for every stream's KV) and sends bursts: `--streams` requests at once,
each a 128-token prompt asking for exactly `--outputs` tokens, streamed, through `/v1/completions` (text
prompt) and `/v1/chat/completions`. For each burst it records the API-server process's on-CPU time (all its
threads, /proc schedstat; the engine core is another process), the burst's wall time, the clients' TTFT and
the chunks that carried a token. Least squares over the bursts of one way, through the origin:

    server CPU = per_request x requests + per_chunk x token chunks

so `per_request` is what parsing, validation, the template, tokenisation, input processing and the stream's
opening and closing cost the process, and `per_chunk` what each streamed token costs it (output processing,
detokenisation, the SSE chunk). One process runs them on one core (Python's GIL), so 1 / per_request bounds
the requests a second one API server admits, whatever the GPU.

Output: DIR/bursts.csv (every burst), DIR/run.json (provenance, engine arguments, the fits), DIR/server.log.
The server's process group is killed on exit, on error, on Ctrl-C and on SIGTERM.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.frontend_latency import (BenchError, build_model_dir, cpu_ns, engine_args, finish, free_port,
                                         http_ttft, prepare, prompts, provenance, say, serve_command, stop,
                                         wait_healthy)
from commandline.argtypes import positive_float, positive_int, positive_int_list
from commandline.exits import run_main
from commandline.outputs import OutputError, out_dir
from commandline.parser import Parser

WAYS = ("completions_text", "chat")
PROMPT_TOKENS = 128


def fit_costs(bursts: list[dict], way: str) -> dict:
    """Least squares `cpu_ms = per_request_ms x requests + per_chunk_ms x chunks` over one way's bursts
    (no intercept: an idle server spends nothing), with the largest relative residual."""
    import numpy as np
    rows = [b for b in bursts if b["way"] == way]
    if len(rows) < 2:
        return {}
    a = np.array([[b["requests"], b["chunks"]] for b in rows], dtype=float)
    y = np.array([b["server_cpu_ms"] for b in rows], dtype=float)
    (per_request, per_chunk), *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = np.abs(a @ [per_request, per_chunk] - y) / y
    return {"way": way, "bursts": len(rows), "per_request_ms": float(per_request), "per_chunk_us": float(per_chunk * 1e3),
            "max_rel_residual": float(resid.max()), "requests_per_s_one_process": float(1e3 / per_request)}


async def measure(args, out: Path, kw: dict, text: str, meta: dict) -> list[dict]:
    import aiohttp
    port = free_port()
    log = open(out / "server.log", "w")
    cmd = serve_command(kw, port)
    meta["serve_command"] = " ".join(cmd)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rows: list[dict] = []
    plan = [(way, n, o) for way in WAYS for n in args.streams for o in args.outputs]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            base = f"http://127.0.0.1:{port}"
            say(f"starting vllm serve on {base} ...")
            meta["serve_ready_s"] = round(await wait_healthy(session, base + "/health", proc, args.start_timeout_s), 1)
            await asyncio.gather(*[http_ttft(session, base, "chat", text, [], 4, args.request_timeout_s)
                                   for _ in range(20)])   # warm-up, not kept
            for k in range(args.repeats):
                for i, (way, n, o) in enumerate(plan if k % 2 == 0 else plan[::-1]):
                    c0, t0 = cpu_ns(proc.pid), time.perf_counter()
                    got = await asyncio.gather(*[http_ttft(session, base, way, text, [], o, args.request_timeout_s)
                                                 for _ in range(n)])
                    wall = time.perf_counter() - t0
                    await asyncio.sleep(0.5)   # the streams' last chunks and the requests' clean-up
                    c1 = cpu_ns(proc.pid)
                    rows.append({"round": k, "way": way, "requests": n, "output_tokens": o, "wall_s": wall,
                                 "server_cpu_ms": (c1[0] - c0[0]) / 1e6, "server_wait_ms": (c1[1] - c0[1]) / 1e6,
                                 "chunks": sum(g["chunks"] for g in got), "ttft_mean_ms": sum(g["ttft_ms"] for g in got) / n,
                                 "load1": os.getloadavg()[0]})
                    r = rows[-1]
                    say(f"round {k + 1}/{args.repeats} {way} x {n}, {o} tokens: server CPU {r['server_cpu_ms']:.0f} ms"
                         f" in {wall:.2f} s, {r['chunks']} chunks")
    finally:
        stop(proc)
        log.close()
    return rows


def parse_args(argv):
    ap = Parser(prog="python -m benchmarks.frontend_load", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--streams", type=positive_int_list, default=[50, 200],
                    help="requests sent at once per burst, comma separated")
    ap.add_argument("--outputs", type=positive_int_list, default=[1, 8, 32],
                    help="tokens each request streams, comma separated")
    ap.add_argument("--repeats", type=positive_int, default=2, help="rounds (each sends every burst)")
    ap.add_argument("--start-timeout-s", type=positive_float, default=300.0)
    ap.add_argument("--request-timeout-s", type=positive_float, default=600.0)
    args = ap.parse_args(argv)
    if len(args.outputs) < 2:
        ap.error("--outputs: at least two lengths (the fit tells a request's cost from a token's by them)")
    try:
        out_dir(args.out)
    except OutputError as e:
        ap.error(str(e))
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    prepare(out, ("aiohttp",))
    max_len = 1024
    model_dir = build_model_dir(out.resolve() / "model", 32000, max_len)
    text, _ = prompts(model_dir, [PROMPT_TOKENS])[PROMPT_TOKENS]
    blocks_per_stream = -(-(PROMPT_TOKENS + 32 + max(args.outputs)) // 32)
    kw = {**engine_args(model_dir, max_len), "max_num_seqs": 256, "max_num_batched_tokens": 8192,
          "num_gpu_blocks_override": blocks_per_stream * max(args.streams) + 64}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    meta = provenance("python -m benchmarks.frontend_load " + " ".join(argv), engine_args=kw,
                      prompt_tokens=PROMPT_TOKENS)
    rows = asyncio.run(measure(args, out, kw, text, meta))
    import pandas as pd
    pd.DataFrame(rows).to_csv(out / "bursts.csv", index=False, float_format="%.4f")
    meta["fits"] = [f for f in (fit_costs(rows, w) for w in WAYS) if f]
    finish(meta, out)
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    for f in meta["fits"]:
        print(f"{f['way']}: API-server CPU {f['per_request_ms']:.2f} ms a request + {f['per_chunk_us']:.0f} us a "
              f"streamed token ({f['bursts']} bursts, largest residual {100 * f['max_rel_residual']:.0f}%): one "
              f"process admits at most {f['requests_per_s_one_process']:.0f} requests a second")
    return 0


if __name__ == "__main__":
    run_main(main, user_errors=(BenchError,), kept="nothing: the files are written when every burst is done")
