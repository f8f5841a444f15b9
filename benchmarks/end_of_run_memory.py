"""What the end of a streamed cluster run allocates for each request and each inter-token gap, without a
simulation: the binding analysis (experiments/binding_streamed.py) over a synthetic request table of
`--requests` rows on 48 replicas and a small streamed iterations table, and the merge of the ITL samples
(simcore.metrics.ItlSamples.finish) over `--gaps` distinct gaps handed over in chunks as a run hands them.
Peaks are tracemalloc's (numpy and pandas report their buffers to it), taken around each call alone.

    python -m benchmarks.end_of_run_memory                       # a day's 2,592,000 requests, 10 M gaps
    python -m benchmarks.end_of_run_memory --requests 500000 --gaps 1000000
"""
from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

from commandline.argtypes import positive_int
from commandline.exits import run_main
from commandline.parser import Parser
from experiments.binding import STEP_COLUMNS
from experiments.binding_streamed import streamed_binding_keys
from simcore.metrics import ItlSamples

NUM_REPLICAS = 48
NUM_STEPS = 20_000      # the iterations table's rows: few, so that the per-request part shows
GAPS_PER_CHUNK = 140_000   # about what one streamed chunk of 2 x 262,144 steps hands over


class _Policy:
    """What the analysis reads of a chunked-prefill policy."""
    name, max_num_seqs, max_num_batched_tokens = "chunked_prefill", 256, 8192


def requests_table(n: int, rng) -> pd.DataFrame:
    arrival = np.sort(rng.uniform(0, 86_400, n))
    admitted = arrival + rng.exponential(0.5, n)
    status = np.where(rng.uniform(size=n) < 0.01, "rejected", "finished").astype(object)
    return pd.DataFrame({"request_id": np.arange(n), "replica_id": rng.integers(0, NUM_REPLICAS, n),
                         "arrival_s": arrival, "prompt_tokens": rng.integers(10, 8000, n),
                         "output_tokens": rng.integers(1, 2000, n), "admitted_s": admitted,
                         "first_token_s": admitted + 0.1, "finish_s": admitted + rng.exponential(5, n),
                         "status": status})


def binding_peak(n: int, rng) -> int:
    """Bytes the streamed binding analysis allocates at its peak over `n` requests."""
    requests = requests_table(n, rng)
    it = pd.DataFrame({c: rng.integers(0, 100, NUM_STEPS) for c in STEP_COLUMNS})
    it["start_s"], it["duration_s"] = np.sort(rng.uniform(0, 86_400, NUM_STEPS)), rng.uniform(0.01, 0.1, NUM_STEPS)
    it["replica_id"] = rng.integers(0, NUM_REPLICAS, NUM_STEPS)
    with tempfile.TemporaryDirectory() as d:
        it.to_parquet(Path(d) / "iterations.parquet")
        tracemalloc.start()
        streamed_binding_keys(_Policy(), requests, d, 10_000, 16)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def itl_peaks(n: int, rng) -> tuple[int, int]:
    """(bytes held by `n` distinct gaps as they are gathered, bytes at the peak of their merge)."""
    samples = ItlSamples()
    tracemalloc.start()
    for k in range(0, n, GAPS_PER_CHUNK):
        gaps = rng.uniform(0.02, 0.2, min(GAPS_PER_CHUNK, n - k))
        samples.add(gaps, np.ones(len(gaps), dtype=np.int64))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    samples.finish()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return held, peak


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.end_of_run_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=positive_int, default=2_592_000, help="request rows (default: a day's)")
    parser.add_argument("--gaps", type=positive_int, default=10_000_000, help="distinct ITL gaps (default 10 M)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    peak = binding_peak(args.requests, rng)
    print(f"binding analysis over {args.requests:,} requests: peak {peak / 2**20:,.0f} MB "
          f"({peak / args.requests:.0f} bytes a request)")
    held, peak = itl_peaks(args.gaps, rng)
    print(f"ITL samples, {args.gaps:,} distinct gaps: {held / args.gaps:.1f} bytes a gap held while running, "
          f"{peak / args.gaps:.1f} at the merge's peak ({peak / 2**20:,.0f} MB)")
    return 0


if __name__ == "__main__":
    run_main(main)
