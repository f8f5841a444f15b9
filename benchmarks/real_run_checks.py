"""How each default cost model fared against real vLLM runs, per GPU, in the form every answer quotes.

    python -m benchmarks.real_run_checks          # after either benchmark below wrote into docs/fidelity/gpu

Reads the committed outputs of `benchmarks.gpu_fidelity` (docs/fidelity/gpu/stages.csv: vLLM's load stages;
runs.csv: LLMServingSim's vLLM 0.19 runs) and `benchmarks.public_gpu_checks` (docs/fidelity/gpu/public/
points.csv: published `vllm bench serve` results) and writes costmodels/real_run_checks.json: per cost model
kind (the roofline prior, the [aic] tables), GPU and engine version, how many stages or runs were replayed
and each headline metric's median |error| and range (simulated / real - 1), over the sustained stages as
gpu_fidelity's own summary takes them, and over the runs whose GPU-to-GPU path is the one their host most
likely had (runs.csv `host_as_run`). costmodels/basis.py reads that file, so an answer resting on the
prior or the tables says how that model did on real runs of the GPU it simulates, or that no real run on
that GPU has checked it. tests/test_real_run_checks.py fails while the file disagrees with the outputs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_fidelity import replayed  # noqa: E402
from commandline.exits import run_main  # noqa: E402
from commandline.outputs import OutputError, out_file  # noqa: E402
from commandline.parser import Parser  # noqa: E402
from costmodels.basis import CHECKS_FILE  # noqa: E402

GPU_DIR = ROOT / "docs" / "fidelity" / "gpu"
# The cost models an answer can rest on by default; a measured profile or a fitted step model carries its
# own held-out error instead.
KINDS = ("roofline", "aic")
# (what was replayed, its error columns by the name an answer gives them)
STAGE_ERRORS = {"per-token": "err_per_token_ms", "TTFT mean": "err_ttft_mean_ms", "E2E mean": "err_e2e_mean_ms"}
RUN_ERRORS = {"TTFT mean": "err_ttft_mean_ms", "TPOT mean": "err_tpot_mean_ms", "E2E mean": "err_e2e_mean_ms"}
POINT_ERRORS = {"duration": "err_duration_s", "TTFT mean": "err_ttft_mean_ms", "TPOT mean": "err_tpot_mean_ms"}


def _errors(g: pd.DataFrame, columns: dict) -> dict:
    """Median |error| and the signed range of each metric over the rows that have it."""
    out = {}
    for name, col in columns.items():
        e = pd.to_numeric(g[col], errors="coerce").dropna() if col in g else pd.Series(dtype=float)
        if len(e):
            out[name] = {"median_abs": round(float(e.abs().median()), 4), "min": round(float(e.min()), 4),
                         "max": round(float(e.max()), 4), "n": int(len(e))}
    return out


class OutputsError(ValueError):
    """A benchmark output without the columns this summary needs: one line, exit 2."""


def _ours(df: pd.DataFrame, keys: list[str], version: str, name: str) -> pd.DataFrame:
    """The rows priced by a default cost model, each (stage or run, kind, GPU) once: `default` is the prior
    itself where the [aic] tables lack the GPU, and counts once."""
    if df.empty:
        return pd.DataFrame(columns=[*keys, "cost_model_kind", "gpu", version])
    missing = [c for c in (*keys, "cost_model_kind", "gpu", version) if c not in df.columns]
    if missing:
        raise OutputsError(f"{name}: no column {missing[0]!r} (written by an older benchmark): rerun it")
    df = df[df["cost_model_kind"].isin(KINDS)]
    return df.drop_duplicates(keys + ["cost_model_kind", "gpu"])


def _version(v) -> str:
    return f"vLLM {str(v).removeprefix('vLLM ').strip()}" if pd.notna(v) and str(v).strip() else "vLLM (version not recorded)"


def checks(stages: pd.DataFrame, runs: pd.DataFrame, points: pd.DataFrame) -> list[dict]:
    """One entry per cost model kind, GPU, engine version and kind of evidence."""
    out = []
    s = _ours(replayed(stages), ["stage_file", "run", "stage"], "vllm_version", "stages.csv")
    for (kind, gpu, version), g in s.groupby(["cost_model_kind", "gpu", "vllm_version"], sort=True):
        sustained = g[g["real_class"] == "sustained"]
        wrong = int(((g["real_class"] != g["sim_class"]) & (g["real_class"] != "unknown")).sum())
        out.append({"cost_model": kind, "gpu": gpu, "engine": _version(version), "what": "load stages",
                    "count": len(g), "sustained": len(sustained), "wrong_side_of_knee": wrong,
                    "errors": _errors(sustained, STAGE_ERRORS), "source": "docs/fidelity/gpu/stages.csv"})
    r = _ours(runs, ["run"], "vllm_version", "runs.csv")
    if not r.empty:   # a row pricing a GPU-to-GPU path the run's host did not have checks nothing
        if "host_as_run" not in r.columns:
            raise OutputsError("runs.csv: no column 'host_as_run' (written by an older benchmark): rerun it")
        r = r[r["host_as_run"].astype(str).str.lower() == "true"]
    for (kind, gpu, version), g in r.groupby(["cost_model_kind", "gpu", "vllm_version"], sort=True):
        out.append({"cost_model": kind, "gpu": gpu, "engine": _version(version),
                    "what": "run" if len(g) == 1 else "runs", "count": len(g), "errors": _errors(g, RUN_ERRORS),
                    "source": "docs/fidelity/gpu/runs.csv"})
    p = _ours(points, ["id"], "vllm", "public/points.csv")
    for (kind, gpu, version), g in p.groupby(["cost_model_kind", "gpu", "vllm"], sort=True):
        out.append({"cost_model": kind, "gpu": gpu, "engine": _version(version),
                    "what": "published run" if len(g) == 1 else "published runs", "count": len(g),
                    "errors": _errors(g, POINT_ERRORS), "source": "docs/fidelity/gpu/public/points.csv"})
    return out


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def from_outputs(gpu_dir: Path = GPU_DIR) -> dict:
    """The file's content from the benchmarks' outputs under `gpu_dir`."""
    return {"written_by": "python -m benchmarks.real_run_checks",
            "from": "the committed outputs of benchmarks.gpu_fidelity and benchmarks.public_gpu_checks "
                    "(docs/fidelity/gpu)",
            "checks": checks(_read(gpu_dir / "stages.csv"), _read(gpu_dir / "runs.csv"),
                             _read(gpu_dir / "public" / "points.csv"))}


def main(argv=None) -> int:
    ap = Parser(prog="python -m benchmarks.real_run_checks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-dir", default=str(GPU_DIR), help="the benchmarks' outputs (default docs/fidelity/gpu)")
    ap.add_argument("--out", default=str(CHECKS_FILE), help="the file answers read (default: the package's)")
    a = ap.parse_args(argv)
    if not Path(a.gpu_dir).is_dir():
        ap.error(f"argument --gpu-dir: {a.gpu_dir} is not a folder")
    try:
        out_file(a.out)
        content = from_outputs(Path(a.gpu_dir))
    except (OutputError, OutputsError) as e:
        ap.error(str(e))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(content, indent=1) + "\n")
    for e in content["checks"]:
        print(f"{e['cost_model']:8} {e['gpu']:22} {e['engine']:12} {e['count']:3} {e['what']}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
