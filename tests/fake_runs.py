"""Real-run fixtures made by a known engine: our own simulator with a known step model and timing noise,
written in fidelity.vllm_run's folder format (or as vllm bench serve JSON / a per-request CSV), so
the readers, fidelity.fit_engine and calibration.compare are tested against an answer known exactly."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from costmodels.stepmodel import TERMS, StepFitCostModel
from experiments.simulate import simulate

TINY_POINT = {
    "model": "tiny", "hardware": "h100-sxm", "dtype": "fp32",
    "engine": {"policy": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 256,
               "num_gpu_blocks": 256, "block_size": 32, "fast_path": "off"},
    "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": 20},
                 "prompt_tokens": {"dist": "lognormal", "median": 128, "sigma": 0.8, "max": 512},
                 "output_tokens": {"dist": "lognormal", "median": 24, "sigma": 0.8, "max": 96}},
}
TRUE = dict(per_step_s=4e-3, per_prefill_seq_s=5e-4, per_decode_seq_s=2e-4, per_token_s=4e-5,
            per_decode_ctx_s=2e-7, per_logit_s=5e-5)
LATENCY_IN_S, LATENCY_OUT_S = 0.002, 0.001


def true_model() -> StepFitCostModel:
    return StepFitCostModel(tuple(TRUE.get(t, 0.0) for t in TERMS), "known", dtype="fp32")


class _Recorder:
    """Prices with the known model times lognormal noise, and records every step it priced."""

    def __init__(self, model, noise: float, seed: int):
        self.model, self.noise = model, noise
        self.rng = np.random.default_rng(seed)
        self.calls: list[dict] = []

    def step_time_s(self, prefill=(), decode=(), num_logits=None):
        self.calls.append({"prefill": [list(p) for p in prefill], "decode": list(decode), "num_logits": num_logits})
        return self.model.step_time_s(prefill, decode, num_logits) * float(np.exp(self.rng.normal(0, self.noise)))

    def describe(self):
        return {"kind": "known"}


def point(arrival: dict, n: int = 40) -> dict:
    raw = json.loads(json.dumps(TINY_POINT))
    raw["workload"]["arrival"] = arrival
    raw["workload"]["num_requests"] = n
    return raw


def make_run(out: Path, label: str, raw: dict, seed: int = 0, noise: float = 0.03, repeat: int = 0) -> Path:
    """One run folder as fidelity.vllm_run writes it; client times include the fixed latencies."""
    rec = _Recorder(true_model(), noise, seed + 1000 * repeat)
    res = simulate(raw, seed, cost_model=rec)
    d = out / "runs" / f"{label}-r{repeat}"
    d.mkdir(parents=True, exist_ok=True)
    req = res.requests.copy()
    req["engine_arrival_s"] = req["arrival_s"] + LATENCY_IN_S
    req["engine_first_token_s"] = req["first_token_s"] + LATENCY_IN_S
    for col in ("first_token_s", "finish_s", "admitted_s"):
        req[col] = req[col] + LATENCY_IN_S + (LATENCY_OUT_S if col != "admitted_s" else 0.0)
    req["ttft_s"] = req["first_token_s"] - req["arrival_s"]
    req["e2e_s"] = req["finish_s"] - req["arrival_s"]
    req.to_csv(d / "requests.csv", index=False)
    it = res.iterations.copy()
    assert len(it) == len(rec.calls)
    it["prefill_json"] = [json.dumps(c["prefill"]) for c in rec.calls]
    it["decode_json"] = [json.dumps(c["decode"]) for c in rec.calls]
    it["num_logits"] = [c["num_logits"] for c in rec.calls]
    it.to_csv(d / "iterations.csv", index=False)
    np.save(d / "itl_gaps_ms.npy", (np.asarray(res.itl_gaps_s) * 1e3).astype(np.float32))
    (d / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (d / "summary.json").write_text(json.dumps({"point": label, "repeat": repeat, "num_gpu_blocks": 256,
                                                "device": "fake", "vllm_version": "known-engine"}))
    return d


def make_calibration_set(out: Path, repeats: int = 1) -> Path:
    """A saturated run, closed loops of 1 and 4 users, and an open-loop run: the calibration the README
    tells a user to run."""
    for k in range(repeats):
        make_run(out, "sat", point({"process": "poisson", "rate_per_s": float("inf")}), seed=1, repeat=k)
        make_run(out, "closed1", point({"process": "closed", "concurrency": 1}, 16), seed=2, repeat=k)
        make_run(out, "closed4", point({"process": "closed", "concurrency": 4}), seed=3, repeat=k)
        make_run(out, "rate10", point({"process": "poisson", "rate_per_s": 10}), seed=4, repeat=k)
    return out


def as_vllm_bench_json(run_dir: Path, path: Path) -> Path:
    """The same run as `vllm bench serve --save-result --save-detailed` saves it (absolute start times)."""
    import pandas as pd
    req = pd.read_csv(run_dir / "requests.csv").sort_values("request_id")
    n = len(req)
    tpot = (req["finish_s"] - req["first_token_s"]) / (req["output_tokens"] - 1).clip(lower=1)
    itls = [[float(t)] * (int(o) - 1) for t, o in zip(tpot, req["output_tokens"])]
    data = {"date": "20261201-000000", "backend": "vllm", "model_id": "tiny", "num_prompts": n,
            "request_rate": "inf", "input_lens": req["prompt_tokens"].tolist(),
            "output_lens": req["output_tokens"].tolist(), "ttfts": req["ttft_s"].tolist(), "itls": itls,
            "start_times": (req["arrival_s"] + 1.7e9).tolist(), "errors": [""] * n}
    path.write_text(json.dumps(data))
    return path
