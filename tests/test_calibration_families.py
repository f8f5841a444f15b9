"""MoE, MLA, fp8 and all-reduce calibration: the capture on the CPU with tiny MoE / MLA configs (families
timed, skipped ones recorded with the reason, fitted, reported, used by the profile), the fit on synthetic
timings (recovers a known MoE cost), the routing a grid point asks for, and the one-line refusals of a
profile that does not fit the simulated model. Never asserts CPU timings."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibration import allreduce, capture as run, family_kernels, fit, grid, measurements  # noqa: E402
from costmodels import get_gpu, get_model, load_cost_model  # noqa: E402
from costmodels.catalog import CatalogError  # noqa: E402
from costmodels.deployment import Deployment  # noqa: E402
from costmodels.profile import profile_cost_model, read_profile  # noqa: E402
from costmodels.profile_families import FamilyProfileCostModel  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_model_families import TINY_MLA, TINY_MOE  # noqa: E402


def config(tmp_path: Path, cfg: dict, name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def mla_moe_run(tmp_path_factory):
    """One CPU calibration of a tiny DeepSeek-shaped model (MLA attention and MoE layers), few repeats:
    the code path, not the timings (--keep-bad-fit: a loaded CI machine may miss the held-out bar)."""
    out = tmp_path_factory.mktemp("calib_mla_moe")
    model = config(out, TINY_MLA, "tiny_mla_moe")
    assert run.main(["--model", model, "--device", "cpu", "--out", str(out / "calib"), "--quiet",
                     "--repeats", "3", "--keep-bad-fit"]) == 0
    return out / "calib", get_model(model)


def test_cpu_run_times_moe_and_mla_families_and_records_the_skipped_ones(mla_moe_run):
    out, model = mla_moe_run
    frame, meta = measurements.read(out)
    assert set(frame["family"]) == {"gemm", "moe", "mla_prefill", "mla_decode", "elementwise", "sampling"}
    assert len(frame) == len(grid.design(model, 1, "small"))   # nothing failed
    ops = set(frame[frame["family"] == "gemm"]["op"])
    assert {"mla_q_a", "mla_q_b", "mla_kv_a", "mla_o", "shared_gate_up", "shared_down"} <= ops
    moe = frame[frame["family"] == "moe"]
    assert set(moe["top_k"]) == {1, 2, 4} and set(moe["imbalance"]) == {1.0, 1.5, 2.0}
    assert set(moe["batch_size"]) == {8} and set(moe["n"]) == {128}   # 8 experts of width 128
    assert (frame[frame["family"] == "mla_prefill"]["cached_tokens"] > 0).any()
    skipped = meta["skipped_families"]
    assert "sm89+" in skipped["gemm_fp8"] and "CUDA" in skipped["allreduce"]


def test_cpu_run_fits_reports_and_the_profile_prices_the_families(mla_moe_run):
    out, model = mla_moe_run
    report = json.loads((out / "fit_report.json").read_text())
    for family in ("moe", "mla_prefill", "mla_decode", "gemm"):
        assert report[family]["num_held_out"] >= 3 and report[family]["held_out_median_ape"] >= 0
    profile = read_profile(out / "profile.json")
    assert profile["family_sources"]["prefill_attn"] == "measured (mla_prefill)"
    assert profile["family_sources"]["moe"] == "measured"
    assert profile["shapes"]["moe"] == {"hidden_size": 256, "expert_width": 128, "num_experts": 8}
    cm = profile_cost_model(profile, model, None, 1, "fp32", deployment=Deployment(dtype="fp32"))
    assert isinstance(cm, FamilyProfileCostModel) and cm.attn_ops == ("mla_q_a", "mla_q_b", "mla_kv_a", "mla_o")
    # the routed experts follow top-k (measured at 1, 2 and 4; monotone by construction of the fit)
    top1, top4 = (profile_cost_model(profile, replace(model, experts_per_token=k), None, 1, "fp32")
                  for k in (1, 4))
    assert top4.moe_layer_s(1024) > top1.moe_layer_s(1024)
    assert top4.step_time_s(prefill=[(1024, 0)]) > top1.step_time_s(prefill=[(1024, 0)])
    skewed = profile_cost_model(profile, model, None, 1, "fp32",
                                deployment=Deployment(dtype="fp32", expert_load_imbalance=2.0))
    # the deployment's imbalance reaches the routed experts' lookup; how much it costs is the CPU's timing (on a
    # busy machine 1.0 and 2.0 can time alike at 256 tokens), so the lookup is checked, not the difference
    k = float(model.experts_per_token)
    assert skewed.moe_layer_s(256) - skewed.moe(256.0, k, 2.0) == pytest.approx(cm.moe_layer_s(256) - cm.moe(256.0, k, 1.0))
    assert skewed.describe()["expert_load_imbalance"] == 2.0


def test_the_calibrated_mla_moe_profile_drives_a_simulation(mla_moe_run, tmp_path):
    from experiments.simulate import simulate
    out, model = mla_moe_run
    cfg = {"model": config(tmp_path, TINY_MLA, "tiny_mla_moe"), "hardware": "l4",
           "profile": str(out / "profile.json"), "dtype": "fp32", "expert_load_imbalance": 1.5,
           "engine": {"policy": "chunked_prefill", "max_num_seqs": 8, "max_num_batched_tokens": 256},
           "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate_per_s": 50},
                        "prompt_tokens": {"dist": "uniform", "min": 16, "max": 200},
                        "output_tokens": {"dist": "uniform", "min": 4, "max": 20}}}
    result = simulate(cfg, seed=0)
    assert result.summary["cost_model"] == "profile" and len(result.requests) == 12
    assert result.resolved["cost_model"]["expert_load_imbalance"] == 1.5   # the sweep's knob reaches the price


def test_the_held_out_bar_takes_the_new_families():
    from calibration.holdout import bad_fits, holdout_limits
    limits = holdout_limits(["moe=5", "allreduce=40"])
    report = {"moe": {"held_out_median_ape": 6.0, "held_out_p90_ape": 9.0, "num_held_out": 20},
              "allreduce_tp2": {"held_out_median_ape": 30.0, "held_out_p90_ape": 50.0, "num_held_out": 3},
              "mla_decode": {"held_out_median_ape": 26.0, "held_out_p90_ape": 30.0, "num_held_out": 5}}
    assert set(bad_fits(report, limits)) == {"moe", "mla_decode"}
    with pytest.raises(ValueError, match="unknown family 'mla'"):
        holdout_limits(["mla=5"])


# ---- the fit on synthetic timings ----
FLOPS_S, BYTES_S, FIXED_S = 0.7 * 989e12, 0.8 * 3.35e12, 4e-6


def moe_s(m, top_k, imbalance, h=256, w=128, experts=8):
    """A known MoE cost: router and expert FLOPs, the busiest expert's share slowing the grouped GEMM."""
    flops = 2 * m * experts * h + 6 * m * top_k * h * w * (1 + 0.3 * (imbalance - 1))
    return max(flops / FLOPS_S, 2 * min(experts, m * top_k) * 3 * h * w / BYTES_S) + 3 * FIXED_S


def synthetic_latency(p: dict) -> float:
    fam = p["family"]
    if fam in ("gemm", "gemm_fp8"):
        m, n, k = p["m"], p["n"], p["k"]
        return max(2 * m * n * k / FLOPS_S, 2 * (m * k + n * k + m * n) / BYTES_S) + FIXED_S
    if fam == "moe":
        return moe_s(p["m"], p["top_k"], p["imbalance"])
    if fam in ("prefill_attn", "mla_prefill"):
        return p["batch_size"] * p["new_tokens"] * (p["cached_tokens"] + p["new_tokens"]) * 1e-9 + 2 * FIXED_S
    if fam in ("decode_attn", "mla_decode"):
        return p["batch_size"] * p["context_len"] * 1e-9 + 3 * FIXED_S
    return 1e-9 * p["m"] + FIXED_S   # elementwise, sampling


def test_fit_recovers_a_known_moe_cost(tmp_path):
    model = get_model(config(tmp_path, TINY_MOE, "tiny_moe"))
    rows = [dict(p, latency_s=synthetic_latency(p), bytes=1e3 * p.get("m", 1), flops=1.0, status="ok", repeats=10)
            for p in grid.design(model, 1, "small") if p["family"] != "decode_attn" or p.get("op") != "mixed"]
    meta = {"model": model.name, "model_shape": asdict(model), "gpu": "h100-sxm", "tp": 1, "dtype": "bf16",
            "source": "synthetic"}
    measurements.write(tmp_path / "m", rows, meta)
    frame, meta = measurements.read(tmp_path / "m")
    profile, report, _ = fit.build_profile(frame, meta, "synthetic")
    assert report["moe"]["held_out_median_ape"] < 5
    cm = profile_cost_model(profile, model, get_gpu("h100-sxm"),
                            deployment=Deployment(expert_load_imbalance=1.5))
    for m in (8, 96, 700):   # between the grid's token counts, at a measured top-k and imbalance
        assert cm.moe(m, 2, 1.5) == pytest.approx(moe_s(m, 2, 1.5), rel=0.1)
    # a MoE layer's MLP is the moe family plus nothing dense: every layer of this model but one is MoE
    dense = profile_cost_model(profile, replace(model, num_moe_layers=0, num_experts=0, experts_per_token=0),
                               get_gpu("h100-sxm"))
    assert cm.dense_layer_s(512) != pytest.approx(dense.dense_layer_s(512), rel=1e-3)


def test_profiles_that_do_not_fit_the_model_are_refused_in_one_line(tmp_path):
    model = get_model(config(tmp_path, TINY_MOE, "tiny_moe"))
    dense = {k: v for k, v in TINY_MOE.items() if k not in ("num_experts", "num_experts_per_tok",
                                                            "moe_intermediate_size", "decoder_sparse_step",
                                                            "mlp_only_layers")}
    dense["architectures"] = ["Qwen3ForCausalLM"]
    dense_model = get_model(config(tmp_path, dense, "tiny_dense"))
    rows = [dict(p, latency_s=synthetic_latency(p), bytes=1e3 * p.get("m", 1), flops=1.0, status="ok", repeats=10)
            for p in grid.design(dense_model, 1, "small") if p["family"] not in ("layer", "iteration")]
    measurements.write(tmp_path / "d", rows, {"model": dense_model.name, "model_shape": asdict(dense_model),
                                              "gpu": "h100-sxm", "tp": 1, "dtype": "bf16"})
    profile, _, _ = fit.build_profile(*measurements.read(tmp_path / "d"), "synthetic")
    with pytest.raises(CatalogError, match="is a MoE model, but the profile has no `moe` family"):
        profile_cost_model(profile, model, get_gpu("h100-sxm"))
    with pytest.raises(CatalogError, match="no fp8 GEMM timings"):
        profile_cost_model(profile, dense_model, get_gpu("h100-sxm"), deployment=Deployment(quantization="fp8"))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(CatalogError, match="expert parallelism is not calibrated"):
        load_cost_model(str(path), model, get_gpu("h100-sxm"),
                        deployment=Deployment(tensor_parallel_size=1, data_parallel_size=2, enable_expert_parallel=True))


# ---- routing, skips and the all-reduce path ----
@pytest.mark.parametrize("tokens,top_k,imbalance", [(1, 2, 1.0), (5, 2, 1.5), (64, 2, 2.0), (100, 4, 1.5), (3, 8, 1.0)])
def test_routing_gives_every_token_top_k_distinct_experts(tokens, top_k, imbalance):
    counts = family_kernels.routed_counts(tokens, top_k, 8, imbalance)
    token_of_pair = family_kernels.assignment(counts, tokens)
    assert sum(counts) == tokens * top_k and np.bincount(token_of_pair, minlength=tokens).tolist() == [top_k] * tokens
    start = np.cumsum([0] + counts)
    assert all(len(set(token_of_pair[a:b])) == b - a for a, b in zip(start[:-1], start[1:]))
    mean = tokens * top_k / 8
    assert counts[0] == min(tokens, max(int(np.ceil(mean)), round(imbalance * mean)))


def test_grouped_gemm_matches_a_loop_over_experts():
    b = family_kernels.Builder(torch.device("cpu"), "fp32")
    counts = family_kernels.routed_counts(40, 2, 8, 2.0)
    grouped, loop = family_kernels._grouped(b, counts)
    x, w = torch.randn(80, 16), torch.randn(8, 16, 24)
    assert torch.allclose(grouped(x, w), loop(x, w), atol=1e-4)


def test_families_this_machine_cannot_time_say_why():
    assert "sm89+" in family_kernels.fp8_supported(torch.device("cpu"))
    assert "needs CUDA GPUs" in allreduce.skip_reason(torch.device("cpu"), 2)
    assert allreduce.degrees(8, 8) == [2, 4, 8] and allreduce.degrees(1, 1) == [] and allreduce.degrees(4, 2) == [2]


def test_allreduce_capture_runs_its_processes_on_gloo():
    """The multi-process path on CPU processes (gloo): rows, not timings (they say nothing of NVLink)."""
    rows = allreduce.capture([1, 4], 64, "fp32", world=2, warmup=1, repeats=3, backend="gloo")
    assert [(r["m"], r["n"], r["num_gpus"], r["op"]) for r in rows] == [(1, 64, 2, "tp2"), (4, 64, 2, "tp2")]
    assert all(r["latency_s"] > 0 and r["repeats"] == 3 for r in rows)


def test_measured_fp8_gemms_and_all_reduce_price_the_step(tmp_path):
    """Synthetic timings of a tiny dense model at TP 2 with fp8 GEMMs at half the bf16 time and a known
    all-reduce: fp8 weights take the fp8 curves, the all-reduce its measured family."""
    model = get_model("tiny")
    rows = [dict(p, latency_s=synthetic_latency(p) * (0.5 if p["family"] == "gemm_fp8" else 1.0),
                 bytes=1e3 * p.get("m", 1), flops=1.0, status="ok", repeats=10)
            for p in grid.design(model, 2, "small", fp8=True) if p["family"] not in ("layer", "iteration")]
    rows += [{"family": "allreduce", "op": "tp2", "m": m, "n": model.hidden_size, "num_gpus": 2,
              "latency_s": 1e-5 + 1e-8 * m, "bytes": 1e3 * m, "flops": 1.0, "status": "ok", "repeats": 20}
             for m in grid.SMALL["gemm_m"]]
    measurements.write(tmp_path / "m", rows, {"model": "tiny", "gpu": "h100-sxm", "tp": 2, "dtype": "bf16"})
    profile, report, _ = fit.build_profile(*measurements.read(tmp_path / "m"), "synthetic")
    assert {"gemm_fp8", "allreduce_tp2"} <= set(report) and profile["family_sources"]["allreduce"].startswith("measured")
    h100 = get_gpu("h100-sxm")
    bf16 = profile_cost_model(profile, model, h100, 2, "bf16", deployment=Deployment(tensor_parallel_size=2))
    fp8 = profile_cost_model(profile, model, h100, 2, "bf16",
                             deployment=Deployment(tensor_parallel_size=2, quantization="fp8"))
    assert bf16.weights == "bf16" and fp8.weights == "fp8"
    assert fp8.layer_gemm["down"](512) == pytest.approx(0.5 * bf16.layer_gemm["down"](512), rel=0.1)
    assert fp8.step_time_s(prefill=[(512, 0)]) < bf16.step_time_s(prefill=[(512, 0)])
    assert bf16._allreduce_s(300) == pytest.approx(2 * (1e-5 + 1e-8 * 300), rel=0.05)
    assert bf16.describe()["allreduce"] == "measured"
