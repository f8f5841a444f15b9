"""`python -m experiments.diagnose SWEEP.yaml [--point ID] [--out DIR]`: confirm what binds at one point by
intervention. The point is rerun on its own seeds with one resource relaxed at a time (KV x2, the sequence
cap x2, the token budget x2, HBM bandwidth x1.25, compute x1.25, one more replica); the table says which
change moves throughput, TTFT and ITL, and by how much: the first binding resource, measured.

Every run but "KV x2" keeps the baseline's KV pool (a bigger token budget would otherwise shrink it through
the activation reserve), so each differs from the baseline in one thing. Bandwidth and compute act through
the datasheet roofline of the deployment: each step's price is scaled by the roofline's time on the faster
GPU over its time on the real one, so a measured profile keeps its own prices and gains the roofline's
sensitivity."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

from experiments.binding import POLICY_KNOBS, binding_sentence

# A change "moves" a metric when it improves it by at least this much: below it, seeds and the run's
# finite length decide as much as the resource does.
MOVE_THRESHOLD = 0.05
METRICS = (("throughput_rps", +1), ("ttft_p99_ms", -1), ("itl_p99_ms", -1))
INTERVENTIONS = ("baseline", "kv_x2", "max_num_seqs_x2", "token_budget_x2", "bandwidth_x1.25", "compute_x1.25",
                 "one_more_replica")


class ScaledCost:
    """A cost model whose step prices are scaled by `faster`'s time over `real`'s for the same step (both
    rooflines of the deployment, the faster on a GPU with more bandwidth or compute)."""

    def __init__(self, base, real, faster):
        self.base, self.real, self.faster = base, real, faster
        # the base's front end (costmodels/frontend.py), which simulate reads off the cost model
        self.frontend = getattr(base, "frontend", None)
        self.request_latency_s = getattr(base, "request_latency_s", 0.0)

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        t = self.base.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits)
        r = self.real.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits)
        return t * self.faster.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits) / r if r else t

    def describe(self) -> dict:
        return {**self.base.describe(), "scaled_by": self.faster.gpu.name}


def relaxed(cfg, what: str):
    """(PointConfig, cost model or None) of `cfg` with one resource relaxed; None when the point has no such
    resource (a policy without a token budget, a constant-cost stub for hardware)."""
    from costmodels.deployment import Deployment
    from costmodels.roofline import RooflineCostModel
    from experiments.sections import ClusterSettings
    from experiments.simulate import memory_plan, point_cost_model
    from policies.routers import RoundRobin
    blocks = memory_plan(cfg).num_gpu_blocks
    pinned = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, num_gpu_blocks=blocks))
    if what == "baseline":
        return pinned, None
    if what == "kv_x2":
        return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, num_gpu_blocks=2 * blocks)), None
    if what in ("max_num_seqs_x2", "token_budget_x2"):
        knobs = POLICY_KNOBS.get(cfg.policy.name, (None, None, None))
        knob = knobs[0] if what == "max_num_seqs_x2" else knobs[1]
        value = getattr(cfg.policy, knob, None) if knob else None
        if value is None:
            return None
        return dataclasses.replace(pinned, policy=dataclasses.replace(cfg.policy, **{knob: 2 * value})), None
    if what == "one_more_replica":
        c = cfg.cluster or ClusterSettings(1, RoundRobin())
        return dataclasses.replace(pinned, cluster=dataclasses.replace(c, num_replicas=c.num_replicas + 1)), None
    if (cfg.profile or "").startswith("constant"):
        return None
    gpu = cfg.gpu
    faster = (dataclasses.replace(gpu, hbm_bytes_per_s=1.25 * gpu.hbm_bytes_per_s) if what == "bandwidth_x1.25" else
              dataclasses.replace(gpu, **{f: 1.25 * getattr(gpu, f) for f in
                                          ("bf16_flops_per_s", "fp8_flops_per_s", "fp4_flops_per_s")
                                          if getattr(gpu, f) is not None}))
    d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
    cost = ScaledCost(point_cost_model(cfg), RooflineCostModel(cfg.model, gpu, deployment=d),
                      RooflineCostModel(cfg.model, faster, deployment=d))
    return pinned, cost


def diagnose(points, progress=None) -> pd.DataFrame:
    """One row per intervention: each metric's mean over `points`' seeds, its change against the baseline
    (a fraction, signed so that > 0 is better), and `moves` (some metric improved by MOVE_THRESHOLD)."""
    from experiments.simulate import simulate
    rows = []
    for what in INTERVENTIONS:
        runs = []
        for p in points:
            r = relaxed(p.config, what)
            if r is None:
                break
            cfg, cost = r
            runs.append(simulate(cfg, p.seed, cost_model=cost).summary)
            if progress:
                progress(what, p.seed)
        if not runs:
            rows.append({"change": what, "note": "not applicable to this point"})
            continue
        row = {"change": what, **{m: sum(s[m] for s in runs) / len(runs) for m, _ in METRICS}}
        if what == "baseline":
            row["binding"] = runs[0].get("binding")
            row["note"] = binding_sentence(runs[0])
            row["cost_model_basis"] = runs[0].get("cost_model_basis")
        rows.append(row)
    df = pd.DataFrame(rows)
    base = df.iloc[0]
    for m, sign in METRICS:
        df[f"{m}_gain"] = sign * (df[m] - base[m]) / base[m]
    gains = df[[f"{m}_gain" for m, _ in METRICS]]
    df["moves"] = (gains >= MOVE_THRESHOLD).any(axis=1) & (df["change"] != "baseline")
    return df


ADMISSION = {"kv": "kv_x2", "max_num_seqs": "max_num_seqs_x2", "token_budget": "token_budget_x2"}
HARDWARE = {"compute": "compute_x1.25", "bandwidth": "bandwidth_x1.25"}


def _best(df: pd.DataFrame, changes) -> tuple[str | None, float]:
    """Of `changes`, the one that moves the result most, and its largest gain; (None, 0) if none moves."""
    sub = df[df["change"].isin(list(changes)) & df["moves"]]
    if not len(sub):
        return None, 0.0
    g = sub[[c for c in sub if c.endswith("_gain")]].max(axis=1)
    return sub.loc[g.idxmax(), "change"], float(g.max())


def verdict(df: pd.DataFrame) -> tuple[str, bool | None]:
    """The measured answer in words, and whether it agrees with the log's `binding` (None: nothing to
    compare). An admission limit agrees when relaxing it moves the result most of the three and the other
    two do not; a GPU limit when its speed-up helps more than the other's and no admission limit moves
    the result; demand and the policy's own rule when no admission limit does."""
    limit, gain = _best(df, ADMISSION.values())
    movers = set(df[df["change"].isin(list(ADMISSION.values())) & df["moves"]]["change"])
    if limit:
        words = f"relaxing {limit} moves the result most (up to {gain:+.0%})"
        words += "; the other admission limits do not" if len(movers) == 1 else f"; so do {', '.join(sorted(movers - {limit}))}"
    else:
        words = f"no admission limit moves the result by {MOVE_THRESHOLD:.0%}"
    hw, hw_gain = _best(df, HARDWARE.values())
    if hw:
        words += f"; of the GPU's speeds, {hw} helps most ({hw_gain:+.0%})"
    said = df.iloc[0].get("binding")
    if not isinstance(said, str):
        agrees = None
    elif said in ADMISSION:
        agrees = movers == {ADMISSION[said]}
    elif said in HARDWARE:
        agrees = not movers and hw == HARDWARE[said]
    else:
        agrees = not movers
    return words[0].upper() + words[1:] + ".", agrees


def table_text(df: pd.DataFrame) -> str:
    show = df.copy()
    for m, _ in METRICS:
        show[m] = [f"{v:,.3g}" if pd.notna(v) else "n/a" for v in show[m]]
        show[f"{m}_gain"] = [f"{v:+.1%}" if pd.notna(v) and c != "baseline" else ""
                             for v, c in zip(show[f"{m}_gain"], show["change"])]
    cols = ["change"] + [c for m, _ in METRICS for c in (m, f"{m}_gain")] + ["moves"]
    return show[cols].to_string(index=False)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


def choose_points(points, point_id: str | None):
    """The points (one per seed) of `point_id` ('p003' or 'p003-seed1'); the only one when there is one."""
    from experiments.config import ConfigError
    ids = sorted({f"p{p.index:03d}" for p in points})
    if point_id is None:
        if len(ids) > 1:
            raise ConfigError(f"--point: the sweep has {len(ids)} points ({ids[0]}..{ids[-1]}); choose one")
        return points
    chosen = [p for p in points if point_id in (p.point_id, f"p{p.index:03d}")]
    if not chosen:
        raise ConfigError(f"--point {point_id}: no such point; expected one of {ids[0]}..{ids[-1]} "
                          "(optionally with -seedN)")
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m experiments.diagnose", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", help="sweep YAML file (as for experiments.run; its search and capacity blocks are "
                                  "ignored)")
    ap.add_argument("--point", help="point id as in results.csv (p003, or p003-seed0 for one seed); required "
                                    "when the grid has several points")
    ap.add_argument("--out", help="also write the table to this CSV file")
    args = ap.parse_args(argv)
    from experiments.run import USER_ERRORS
    from experiments.config import ConfigError, expand, load_sweep_file
    try:
        sweep = load_sweep_file(args.sweep)
        sweep = {k: v for k, v in sweep.items() if k not in ("search", "capacity")}
        points = choose_points(expand(sweep), args.point)
        if any(p.config.disaggregation is not None for p in points):
            raise ConfigError("--point: a disaggregated deployment has two kinds of replica; diagnose one "
                                 "pool's configuration as a co-located point")
        df = diagnose(points)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            df.to_csv(args.out, index=False)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 2
    p = points[0]
    print(f"{p.point_id.split('-')[0]} ({p.config.policy.name}, seeds {', '.join(str(q.seed) for q in points)})")
    if isinstance(df.iloc[0].get("note"), str):
        print(f"Read from the log: {df.iloc[0]['note']}")
    print(table_text(df))
    words, agrees = verdict(df)
    print(f"Measured: {words}")
    if agrees is not None:
        print(f"The log's answer ({df.iloc[0]['binding']}) "
              + ("agrees with the intervention." if agrees else "is NOT confirmed by the intervention."))
    from costmodels.basis import rests_on
    from experiments.answer_basis import point_router_bases, point_vllm_versions, schedules_line, seeds_line
    print(f"rests on the {rests_on({p.point_id: df.iloc[0].get('cost_model_basis')})}; the bandwidth and "
          f"compute rows on the datasheet roofline's sensitivity\n{schedules_line([p.config.policy.name], point_vllm_versions([p]), point_router_bases([p]))}; "
          f"{seeds_line(len(points))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
