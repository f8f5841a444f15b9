"""Offered against achieved load over time: requests sent and requests finished per time bin, one panel per
run, with the configured rate where it changes over time (workloads/rates.py). Where the two curves part,
the deployment fell behind its traffic; where they meet again, it caught up."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.plots import _save, plt

NUM_BINS = 120


def load_over_time(runs: dict[str, tuple[np.ndarray, np.ndarray, object]], path: Path, subtitle: str) -> Path:
    """`runs`: label -> (arrival times, finish times of the finished requests, the rate profile or None)."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.5 + 2.4 * len(runs)), squeeze=False)
    for ax, (label, (arrival_s, finish_s, profile)) in zip(axes[:, 0], runs.items()):
        end = float(max(arrival_s.max(initial=0.0), finish_s.max(initial=0.0))) or 1.0
        edges = np.linspace(0.0, end, NUM_BINS + 1)
        width = edges[1] - edges[0]
        offered = np.histogram(arrival_s, edges)[0] / width
        achieved = np.histogram(finish_s, edges)[0] / width
        ax.step(edges[:-1], offered, where="post", color="#1f77b4", lw=1.0, label="offered (sent)")
        ax.step(edges[:-1], achieved, where="post", color="#d62728", lw=1.0, label="achieved (finished)")
        if profile is not None:
            t = np.linspace(0.0, float(arrival_s.max(initial=0.0)), 400)
            ax.plot(t, profile.rate_at(t), "--", color="0.3", lw=0.9, label="configured rate")
        ax.set_ylabel("requests/s", fontsize=9)
        ax.set_title(label, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(f"simulated time (s); {NUM_BINS} bins")
    return _save(fig, path, f"Offered vs achieved load over time\n{subtitle}")
