"""What an answer rests on, in one line: the cost model that priced its steps, where that model's figures
come from and how well they held up on data left out of their fit.

Every output that states an answer (the console, summary.md, results.csv, search.csv, capacity.csv and
each plot) carries this line, so that two answers to the same question can be told apart at a glance:
a measured profile, NVIDIA's kernel tables ([aic] extra), the datasheet roofline prior, or a whole-step
model fitted to real engine runs. The prior and the tables also say how they fared against real vLLM runs
on the GPU simulated (real_run_checks.json beside this file, written by `python -m
benchmarks.real_run_checks` from docs/fidelity/gpu), or that no real run on that GPU has checked them.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

CHECKS_FILE = Path(__file__).with_name("real_run_checks.json")


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


@functools.lru_cache(maxsize=1)
def _checks() -> tuple[dict, ...] | None:
    """The shipped checks; None when the file cannot be read (then no answer claims a GPU is unchecked)."""
    try:
        return tuple(json.loads(CHECKS_FILE.read_text())["checks"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _signed(v: float) -> str:
    r = round(v * 100)
    return "0" if r == 0 else f"{r:+d}"


def _error_words(e: dict) -> str:
    """'2.2% (-6..+6%)': median |error| and the signed range; one value alone when there is one."""
    if e["n"] == 1 or e["min"] == e["max"]:
        return f"{e['min']:+.1%}"
    return f"{e['median_abs']:.1%} ({_signed(e['min'])}..{_signed(e['max'])}%)"


def real_run_words(kind: str, gpu: str | None) -> str:
    """How the cost model of `kind` did against real vLLM runs on `gpu` (a catalog GPU as the catalog has
    it), in words; that no real run has checked it there when none has."""
    checks = _checks()
    if checks is None:
        return f"real-run checks on {gpu} not known here ({CHECKS_FILE.name} unreadable)"
    found = [c for c in checks if c.get("cost_model") == kind and c.get("gpu") == gpu]
    if not found:
        return f"not checked against a real vLLM run on {gpu}"
    parts = []
    for c in found:
        what = f"{c['count']} {c['what']}"
        if "sustained" in c and c["sustained"] != c["count"]:
            what += f" ({c['sustained']} sustained)"
        errors = ", ".join(f"{name} {_error_words(e)}" for name, e in c["errors"].items())
        knee = (f", {c['wrong_side_of_knee']} of {c['count']} on the wrong side of the knee"
                if "wrong_side_of_knee" in c else "")
        parts.append(f"{c['engine'].removeprefix('vLLM ')}, {what}: {errors}{knee}")
    return (f"checked on {gpu} against real vLLM (median |error|, range; docs/fidelity/gpu): "
            + "; ".join(parts))


def _checked(described: dict) -> str:
    """'; ' + real_run_words for the GPU simulated, when it is the catalog's GPU under its own name."""
    gpu = described.get("gpu")
    if not gpu:
        return ""
    if described.get("gpu_as_catalog") is False:
        return f"; not checked against a real vLLM run on {gpu} (figures of its own)"
    return "; " + real_run_words(described.get("kind", "?"), gpu)


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
        return line + _checked(described)
    if kind == "roofline":
        represents = described.get("represents")
        return (f"roofline prior of batchsim {batchsim_version()} (datasheet peaks x efficiencies, not measured"
                + (f"; represents {represents})" if represents else ")") + _checked(described))
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


CHECK_MARKS = ("; checked on ", "; not checked against a real vLLM run on ", "; real-run checks on ")


def split_basis(line: str) -> tuple[str, str]:
    """(the cost model, what real runs on the simulated GPU said of it) of a basis line: two answers on
    one cost model and two GPUs rest on the same model, checked differently."""
    at = max(line.rfind(m) for m in CHECK_MARKS)
    return (line, "") if at < 0 else (line[:at], line[at + 2:])


def brief_checks(line: str) -> str:
    """A basis line with its real-run checks cut to where they are (a figure's subtitle has no room for
    the errors; the console and summary.md give them)."""
    model, check = split_basis(line)
    if check.startswith("checked on "):
        check = check.split(" (median |error|")[0] + " runs (docs/fidelity/gpu)"
    return f"{model}; {check}" if check else model


def rests_on(bases, brief: bool = False) -> str:
    """The cost models behind a set of answers, in words: one line when they share one (with each GPU's
    real-run checks), else each with the answers' labels (`bases`: label -> costmodels.basis line).
    `brief`: each check cut to where it is (brief_checks)."""
    lines = {k: (brief_checks(b) if brief else b) for k, b in bases.items() if isinstance(b, str) and b}
    models = list(dict.fromkeys(split_basis(b)[0] for b in lines.values()))
    if not models:
        return "cost model not recorded"
    if len(models) == 1:
        checks = [c for c in dict.fromkeys(split_basis(b)[1] for b in lines.values()) if c]
        return f"cost model: {models[0]}" + "".join(f"; {c}" for c in checks)
    distinct = list(dict.fromkeys(lines.values()))
    return "cost models: " + "; ".join(
        f"{', '.join(k for k, b in lines.items() if b == d)}: {d}" for d in distinct) + (
        ". These answers rest on different cost models: part of a difference between them may be the cost "
        "models' (docs/cost-models.md); set one `profile:` for all to compare like with like")
