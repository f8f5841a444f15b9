"""summary.md's "What binds" section for a sweep (one sentence per point, experiments/binding.py) and its
figure (experiments/binding_plot.py), appended after the rest of the report is written."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.binding import binding_sentence
from experiments.binding_plot import binding_vs_load

LOAD_SUFFIXES = ("arrival.concurrency", "arrival.rate_per_s")


def binding_section(results: pd.DataFrame, grid_keys: list[str]) -> list[str]:
    """Markdown lines: per results row, its label and loads, then what bound it."""
    if "binding" not in results.columns:
        return []
    loads = [k for k in grid_keys if k.endswith(LOAD_SUFFIXES)]
    lines = ["## What binds", "",
             "Why a waiting request was left waiting, per step of the engine's own log, over the steps before "
             "the run drains; and how the roofline splits the steps' GPU time (`bind_*` and `bound_*` columns "
             "of results.csv; `python -m experiments.diagnose` confirms a limit by relaxing it).", ""]
    for _, r in results.iterrows():
        where = ", ".join(f"{k.split('.')[-1]} {r[k]:g}" if isinstance(r[k], float) else f"{k.split('.')[-1]} {r[k]}"
                          for k in loads if k in r)
        sentence = binding_sentence(r)
        if sentence:
            lines.append(f"- **{r.get('label', r['policy'])}{', ' + where if where else ''}** (`{r['point']}`): "
                         + sentence)
    return lines + [""]


def append_binding_section(out: Path, results: pd.DataFrame, grid_keys: list[str], setup: str) -> list[Path]:
    """Draw the binding figure (when a load is swept) and append the section to `out`/summary.md; the
    figure's path, in a list (empty when there is nothing to show)."""
    lines = binding_section(results, grid_keys)
    if not lines:
        return []
    made = []
    loads = [k for k in grid_keys if k.endswith(LOAD_SUFFIXES)]
    if loads:
        label = results["label"] if "label" in results else results["policy"]
        curves = {lab: df for lab, df in results.assign(label=label).groupby("label", sort=False)
                  if np.isfinite(df[[c for c in df if c.startswith("bind_")]].to_numpy(float)).any()}
        made.append(binding_vs_load(curves, loads[0], out / "plots" / "binding_vs_load.png", setup))
        lines += [f"![binding_vs_load](plots/{made[0].name})", ""]
    with open(out / "summary.md", "a") as f:
        f.write("\n" + "\n".join(lines))
    return made
