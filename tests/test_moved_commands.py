"""The commands that moved out of calibration/ keep answering at their old names, saying where they went."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("old, new", [("calibration.fit_engine", "fidelity.fit_engine"),
                                      ("calibration.vllm_run", "fidelity.vllm_run"),
                                      ("calibration.validate", "fidelity.validate"),
                                      ("calibration.run", "calibration.capture")])
def test_old_name_forwards_and_says_where(old, new):
    r = run(old, "--help")
    assert r.returncode == 0, r.stderr
    assert f"`python -m {old}` is now `python -m {new}`" in r.stderr
    assert f"python -m {new}" in r.stdout   # the new command's own usage line


def test_compare_of_real_runs_forwards_to_fidelity(tmp_path):
    bad = tmp_path / "run.csv"
    bad.write_text("prompt_tokens,output_tokens,ttft_s,e2e_s\n5,3,0.1,0.2\n")
    r = run("calibration.compare", str(bad))
    assert "is now `python -m fidelity.compare`" in r.stderr
    assert r.returncode == 2 and "no arrival_s column" in r.stderr and "Traceback" not in r.stderr


def test_calibration_imports_nothing_from_above():
    """calibration/ makes profiles from kernel timings: it imports torch and costmodels, never the packages
    that run engines (fidelity, experiments, simcore, policies, workloads)."""
    import ast
    above = {"fidelity", "experiments", "simcore", "policies", "workloads"}
    for path in (ROOT / "calibration").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not {n.split(".")[0] for n in names} & above, f"{path.name} imports {names}"
