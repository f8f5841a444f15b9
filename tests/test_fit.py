"""Fit-to-trace: recovers known parameters, and prints a workload block the sweep loader accepts."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from workloads.fit import fit_arrivals, fit_lengths, fit_workload, main
from workloads.synthetic import parse_workload
from workloads.traces import Trace, load_trace

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def test_recovers_known_parameters():
    rng = np.random.default_rng(0)
    x = np.rint(rng.lognormal(6.6, 1.0, 20000)).clip(1)
    f = fit_lengths(x, "lognormal")
    assert math.log(f.params["median"]) == pytest.approx(6.6, abs=0.03) and f.params["sigma"] == pytest.approx(1.0, abs=0.03)
    p = 5 * (1 + rng.pareto(1.5, 20000))
    assert fit_lengths(p, "pareto").params["alpha"] == pytest.approx(1.5, rel=0.05)
    assert fit_lengths(p, "auto").dist == "pareto"
    k = 1 / 3.0**2  # gamma gaps with CV 3
    t = np.cumsum(rng.gamma(k, 0.5 / k, 40000))
    a = fit_arrivals(t)
    assert a["rate_per_s"] == pytest.approx(2.0, rel=0.05) and a["cv"] == pytest.approx(3.0, rel=0.1)


def test_printed_block_is_a_valid_workload(tmp_path, capsys):
    rng = np.random.default_rng(1)
    n = 300
    lines = "".join(f"{t:.4f},{p},{o}\n" for t, p, o in zip(np.cumsum(rng.exponential(0.5, n)),
                                                             rng.integers(10, 900, n), rng.integers(1, 200, n)))
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + lines)
    assert main([str(path), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    block = yaml.safe_load(out)["workload"]
    w = parse_workload(block)
    assert w.num_requests == n and w.prompt_tokens.dist == "lognormal"
    assert main([str(tmp_path / "missing.csv"), "--format", "csv"]) == 2


@pytest.mark.skipif(not (SHARED / "AzureLLMInferenceTrace_conv.csv").exists(),
                    reason="real traces not present in ../shared/traces")
def test_azure_conversation_matches_reference_fit():
    w = fit_workload(load_trace(str(SHARED / "AzureLLMInferenceTrace_conv.csv"), "azure"))
    assert math.log(w["prompt_tokens"]["median"]) == pytest.approx(6.63, abs=0.01)
    assert w["prompt_tokens"]["sigma"] == pytest.approx(0.99, abs=0.01)
    assert math.log(w["output_tokens"]["median"]) == pytest.approx(5.02, abs=0.01)
    assert w["output_tokens"]["sigma"] == pytest.approx(0.86, abs=0.01)
    assert w["arrival"] == {"process": "gamma", "rate_per_s": pytest.approx(5.53, abs=0.01), "cv": pytest.approx(1.09, abs=0.01)}
