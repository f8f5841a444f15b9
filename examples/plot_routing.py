"""Run examples/routing.yaml (mixed chat + long generations on a 4-replica cluster) and plot, per router,
the latency each traffic class sees: `python examples/plot_routing.py [--out docs/routing_split.png]`.

A request is "chat" when its output fits chat's 1024-token cap, else a "long" generation (the classes of
the sweep's workload.mix). Prints the per-class table the plot is drawn from.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.config import expand, load_sweep_file  # noqa: E402
from experiments.simulate import simulate  # noqa: E402

CHAT_MAX_OUTPUT_TOKENS = 1024


def per_class(requests: pd.DataFrame) -> dict:
    fin = requests[requests["status"] == "finished"]
    chat = fin[fin["output_tokens"] <= CHAT_MAX_OUTPUT_TOKENS]
    long = fin[fin["output_tokens"] > CHAT_MAX_OUTPUT_TOKENS]
    q = lambda s, p: float(s.quantile(p) * 1e3)  # noqa: E731
    return {"chat_ttft_p50_ms": q(chat.ttft_s, .5), "chat_ttft_p99_ms": q(chat.ttft_s, .99),
            "chat_tpot_p50_ms": q(chat.tpot_s, .5), "chat_tpot_p99_ms": q(chat.tpot_s, .99),
            "long_tpot_p50_ms": q(long.tpot_s, .5), "long_tpot_p99_ms": q(long.tpot_s, .99),
            "long_e2e_p50_s": q(long.e2e_s, .5) / 1e3, "num_chat": len(chat), "num_long": len(long)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", default=str(ROOT / "examples" / "routing.yaml"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "routing_split.png"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows = []
    for point in expand(load_sweep_file(args.sweep)):
        res = simulate(point.config, args.seed)
        r = point.config.cluster.router
        label = r.name if r.name != "length_split" else f"length_split ({r.num_long_replicas} long replicas)"
        rows.append({"router": label, **per_class(res.requests), "num_preemptions": res.summary["num_preemptions"]})
    table = pd.DataFrame(rows)
    print(table.round(1).to_string(index=False))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = range(len(table))
    for ax, cols, title in [
        (axes[0], ["chat_tpot_p50_ms", "chat_tpot_p99_ms"], "chat: time per output token (ms)"),
        (axes[1], ["chat_ttft_p50_ms", "chat_ttft_p99_ms"], "chat: time to first token (ms)"),
        (axes[2], ["long_tpot_p50_ms", "long_tpot_p99_ms"], "long generations: TPOT (ms)"),
    ]:
        for j, c in enumerate(cols):
            ax.bar([i + (j - 0.5) * 0.38 for i in x], table[c], width=0.38, label=c.split("_")[-2])
        ax.set_xticks(list(x), table["router"].str.replace(" (", "\n("), fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1.18 * float(table[cols].to_numpy().max()))   # room above the bars for the legend
        ax.legend(fontsize=8, loc="upper left", ncols=2)
    cfg = load_sweep_file(args.sweep)
    fig.suptitle(f"{cfg['cluster']['num_replicas'] if 'cluster' in cfg else '?'} replicas of {cfg['model']} on "
                 f"{cfg['hardware']}, {cfg['workload']['arrival']['rate_per_s']} req/s: 90% chat + 10% long "
                 f"generations (seed {args.seed})", fontsize=10)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
