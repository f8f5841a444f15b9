"""The binding-limit figure: for each configuration, the share of steps at which each limit held (sequence
cap, token budget, KV, the scheduler's own rule, or nothing waited) at each load, as stacked bars."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments.binding import LIMITS
from experiments.plots import _title, _write, plt

LIMIT_COLORS = {"demand": "#cfd8dc", "max_num_seqs": "#1f77b4", "token_budget": "#ff7f0e", "kv": "#d62728",
                "policy": "#9467bd"}


def _load_text(v) -> str:
    return "all at t=0" if isinstance(v, float) and math.isinf(v) else f"{v:g}"


def binding_vs_load(curves: dict[str, pd.DataFrame], load_col: str, path: Path, subtitle: str) -> Path:
    """`curves`: label -> results rows with `bind_<limit>_steps` columns, `binding` and `load_col`; one
    panel per label, one stacked bar per load (mean over seeds), the limit named under each bar."""
    fig, axes = plt.subplots(len(curves), 1, figsize=(7.5, 1.2 + 2.1 * len(curves)), squeeze=False, sharex=False)
    for ax, (label, df) in zip(axes[:, 0], curves.items()):
        shares = df.groupby(load_col)[[f"bind_{k}_steps" for k in LIMITS]].mean().sort_index()
        x = range(len(shares))
        bottom = pd.Series(0.0, index=shares.index)
        for k in LIMITS:
            v = 100 * shares[f"bind_{k}_steps"].fillna(0.0)
            ax.bar(x, v, bottom=bottom, color=LIMIT_COLORS[k], label=k, width=0.7)
            bottom += v
        named = df.groupby(load_col)["binding"].agg(lambda b: "/".join(sorted(set(map(str, b))))).sort_index()
        ax.set_xticks(list(x), [f"{_load_text(v)}\n{named.get(v, '')}" for v in shares.index], fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of steps", fontsize=9)
        ax.set_title(label, fontsize=9)
    axes[-1, 0].set_xlabel("arrival rate (requests/s)" if load_col.endswith("rate_per_s") else load_col)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(LIMITS), fontsize=8, frameon=False)
    fig.suptitle(_title(f"What held back a waiting request, by load (the binding limit under each bar)\n{subtitle}"),
                 fontsize=10)
    return _write(fig, path, rect=(0, 0.05, 1, 1))
