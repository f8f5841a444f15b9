"""What an answer rests on, in one line: the cost model that priced its steps, where that model's figures
come from and how well they held up on data left out of their fit.

Every output that states an answer (the console, summary.md, results.csv, search.csv, capacity.csv and
each plot) carries this line, so that two answers to the same question can be told apart at a glance:
a measured profile, NVIDIA's kernel tables ([aic] extra), the datasheet roofline prior, or a whole-step
model fitted to real engine runs.
"""
from __future__ import annotations

from pathlib import Path


def batchsim_version() -> str:
    """The installed package's version (the roofline prior's figures are the code's: they change with it)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("batchsim")
    except (ImportError, PackageNotFoundError):
        return "unknown"


def _pct(v) -> str:
    """A held-out error as a percentage; a family with too few points to hold any out has none."""
    return "none held out" if v is None else f"{float(v):.1f}%"


def _profile_error(fit_report: dict) -> str:
    """'median held-out error gemm 3.8%, prefill_attn 6.6%, decode_attn 2.4%' from a profile's fit_report."""
    parts = [f"{fam} {_pct(r['held_out_median_ape'])}" for fam, r in fit_report.items()
             if isinstance(r, dict) and "held_out_median_ape" in r]
    return "median held-out error " + ", ".join(parts) if parts else "no held-out error recorded"


def _aic_error(held_out: dict) -> str:
    parts = [f"{fam} {_pct(r['median_pct'])}" for fam, r in held_out.items()
             if isinstance(r, dict) and "median_pct" in r]
    return "median held-out error " + ", ".join(parts) if parts else "no held-out error recorded"


def basis_line(described: dict) -> str:
    """One line from a cost model's `describe()`."""
    kind = described.get("kind", "?")
    if kind == "profile":
        prov = described.get("provenance") or {}
        made = " ".join(str(prov[k]) for k in ("source", "framework") if prov.get(k))
        where = prov.get("device_name") or described.get("measured_on", "?")
        name = Path(str(described.get("source", "?"))).stem
        line = f"measured profile {name} (kernel timings{' from ' + made if made else ''} on {where}"
        line += f"; {_profile_error(described.get('held_out_error') or {})})"
        if described.get("measured_on") and described.get("gpu") and described["measured_on"] != described["gpu"]:
            line += f", measured on {described['measured_on']}, simulating {described['gpu']}"
        return line
    if kind == "aic":   # a family the table guard dropped is priced by the prior: its table's error is moot
        guard = described.get("table_guard")
        guard = guard if isinstance(guard, dict) else {}
        error = _aic_error({k: v for k, v in (described.get("held_out_error") or {}).items() if k not in guard})
        line = f"NVIDIA kernel tables: {described.get('source', '?')}; {error}"
        if guard:
            line += ("; the roofline prior instead for " + ", ".join(f"{k} ({why})" for k, why in guard.items())
                     + ", far off the tables' physical bounds")
        weights = str((described.get("family_sources") or {}).get("gemm_weights", ""))
        if weights.startswith("roofline prior (no "):   # a weight format the tables lack (int4, int8, nvfp4 on Hopper)
            line += f"; the roofline prior for the weight GEMMs ({weights[len('roofline prior ('):-1]})"
        return line
    if kind == "roofline":
        represents = described.get("represents")
        return (f"roofline prior of batchsim {batchsim_version()} (datasheet peaks x efficiencies, not measured"
                + (f"; represents {represents})" if represents else ")"))
    if kind == "stepfit":
        held = described.get("held_out")
        err = f"; held-out error {held}" if held not in (None, {}, "") else ""
        return f"step model fitted to real engine runs ({described.get('source', '?')}){err}"
    if kind == "constant":
        return "constant step cost (a hand-set stub, not a GPU)"
    return f"cost model {kind} ({described.get('source', '?')})"


def cost_model_basis(cost_model) -> str:
    """`basis_line` of a cost-model object."""
    describe = getattr(cost_model, "describe", None)
    return basis_line(describe()) if describe is not None else f"cost model {type(cost_model).__name__}"


def rests_on(bases) -> str:
    """The cost models behind a set of answers, in words: one line when they share one, else each with the
    answers' labels (`bases`: label -> costmodels.basis line)."""
    distinct = list(dict.fromkeys(b for b in bases.values() if isinstance(b, str) and b))
    if not distinct:
        return "cost model not recorded"
    if len(distinct) == 1:
        return f"cost model: {distinct[0]}"
    return "cost models: " + "; ".join(
        f"{', '.join(k for k, b in bases.items() if b == d)}: {d}" for d in distinct) + (
        ". These answers rest on different cost models: part of a difference between them may be the cost "
        "models' (docs/cost-models.md); set one `profile:` for all to compare like with like")
