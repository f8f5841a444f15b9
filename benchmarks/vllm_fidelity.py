"""Fidelity against real vLLM V1 on this machine: calibrate the way the README tells a user to, then judge
the simulator on runs the fit never saw (other loads, other lengths, other seeds).

    python benchmarks/vllm_fidelity.py --out results/vllm-fidelity [--models tiny,wide8] [--repeats 3]

Per model shape (`tiny`: 4 layers, hidden 256, the shape this work was developed on; `wide8`: 8 layers,
hidden 512, not tuned on; `tiny-moe`: `tiny` with a Qwen3-MoE MLP of 8 experts, top-2; `tiny-mla`: a
DeepSeek-V2 layout, MLA attention and MoE, in bf16):
1. calibration: `fidelity.vllm_run` of a saturated run and closed loops of 1, 2 and 4 users (seed 100,
   calibration lengths, `--calib-repeats` round robin), then `fidelity.fit_engine` on them -> profile.json (with its own
   leave-one-point-out report);
2. capacity: `--repeats` saturated runs (everything sent at t = 0; seed 0, validation lengths);
3. below saturation: Poisson arrivals at 50% and 80% of the measured capacity, `--repeats` runs each,
   round robin (seed 0, validation lengths: longer prompts and outputs than the calibration's);
4. `fidelity.compare` of 2 and 3 with the profile.
Targets: per-step time median <= 5%, p90 <= 15%; saturated throughput within 5%; below
saturation every simulated p50/p99 TTFT, TPOT and E2E inside the real runs' range and within 5% of their
median. Writes report.md and the folders of every step under --out; prints progress.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from commandline.argtypes import positive_int  # noqa: E402
from commandline.exits import refuse, run_main  # noqa: E402
from commandline.outputs import OutputError, out_dir  # noqa: E402
from commandline.parser import Parser  # noqa: E402
from experiments.report import md_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "tiny": "tiny",
    "wide8": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"},
    # `tiny`'s attention with a Qwen3-MoE MLP in every layer: 8 experts, top-2, each expert as wide as
    # `tiny`'s MLP (vLLM's CPU build runs it through its fused-MoE CPU kernel)
    "tiny-moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
                 "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "vocab_size": 1024, "max_position_embeddings": 2048,
                 "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
                 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"},
    # DeepSeek-V2 layout: MLA attention (latent 256 + rope 64: vLLM's CPU MLA kernels take a latent + rope
    # width of 320, 512 or 576 only), layer 0 dense, then 8 routed experts top-2 plus one shared expert.
    # bf16: on an AMX CPU vLLM picks its AMX MLA kernel, which refuses fp32 weights.
    "tiny-mla": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
                 "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "kv_lora_rank": 256, "q_lora_rank": None, "qk_rope_head_dim": 64,
                 "qk_nope_head_dim": 64, "v_head_dim": 64, "n_routed_experts": 8, "n_shared_experts": 1,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 256, "first_k_dense_replace": 1,
                 "moe_layer_freq": 1, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                 "routed_scaling_factor": 1.0, "norm_topk_prob": False, "scoring_func": "softmax",
                 "rope_scaling": None, "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                 "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
                 "eos_token_id": 2, "torch_dtype": "bfloat16"},
}
DTYPES = {"tiny-mla": "bf16"}  # every other shape runs fp32
ENGINE = {"policy": "chunked_prefill", "max_num_seqs": 32, "max_num_batched_tokens": 256, "num_gpu_blocks": 160,
          "block_size": 32, "max_model_len": 2048}
CALIB_LENGTHS = {"prompt_tokens": {"dist": "lognormal", "median": 128, "sigma": 0.8, "max": 768},
                 "output_tokens": {"dist": "lognormal", "median": 32, "sigma": 0.8, "max": 160}}
VALID_LENGTHS = {"prompt_tokens": {"dist": "lognormal", "median": 192, "sigma": 0.8, "max": 1024},
                 "output_tokens": {"dist": "lognormal", "median": 48, "sigma": 0.8, "max": 192}}
JUDGED = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(*args: str) -> None:
    cmd = [sys.executable, "-m", *args]
    say("$ python -m " + " ".join(args))
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("(") and "WARNING" not in ln]
    for ln in lines[-8:]:
        print("    " + ln, flush=True)
    if r.returncode not in (0, 3):  # 3: fit_engine refused a bad fit (reported, written as .refused.json)
        raise SystemExit(f"failed ({r.returncode}): {' '.join(args)}")


def sweep(path: Path, n: int, seed: int, lengths: dict, arrivals: list[dict], dtype: str = "fp32") -> Path:
    path.write_text(yaml.safe_dump({"seeds": [seed], "dtype": dtype, "engine": ENGINE,
                                    "workload": {"num_requests": n, "arrival": arrivals[0], **lengths},
                                    "grid": {"workload.arrival": arrivals}}, sort_keys=False))
    return path


def one_shape(name: str, model, out: Path, args) -> dict:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(model, dict):
        (d / "config.json").write_text(json.dumps(model))
        model = str(d / "config.json")
    n = args.num_requests
    common = ["--model", model, "--device", "cpu"]
    dtype = DTYPES.get(name, "fp32")
    calib = sweep(d / "calib.yaml", n, 100, CALIB_LENGTHS,
                  [{"process": "poisson", "rate_per_s": float("inf")}] +
                  [{"process": "closed", "concurrency": c} for c in (1, 2, 4)], dtype)
    run("fidelity.vllm_run", *common, "--config", str(calib), "--out", str(d / "calib"),
        "--repeats", str(args.calib_repeats))
    profile = d / "profile.json"
    for stale in (profile, d / "profile.refused.json"):  # a rerun refits: never judge an older fit
        stale.unlink(missing_ok=True)
    run("fidelity.fit_engine", str(d / "calib"), "--out", str(profile))
    if not profile.exists():
        profile = d / "profile.refused.json"
    sat = sweep(d / "sat.yaml", n, 0, VALID_LENGTHS, [{"process": "poisson", "rate_per_s": float("inf")}], dtype)
    run("fidelity.vllm_run", *common, "--config", str(sat), "--out", str(d / "sat"), "--repeats", str(args.repeats))
    capacity = float(pd.read_csv(d / "sat" / "results.csv")["throughput_rps"].median())
    say(f"{name}: measured capacity {capacity:.2f} req/s")
    val = sweep(d / "val.yaml", n, 0, VALID_LENGTHS,
                [{"process": "poisson", "rate_per_s": round(f * capacity, 3)} for f in (0.5, 0.8)], dtype)
    run("fidelity.vllm_run", *common, "--config", str(val), "--out", str(d / "val"), "--repeats", str(args.repeats))
    run("fidelity.compare", str(d / "sat"), str(d / "val"), "--profile", str(profile), "--out", str(d / "compare"))
    return judge(name, d, profile, capacity)


def judge(name: str, d: Path, profile: Path, capacity: float) -> dict:
    m = pd.read_csv(d / "compare" / "compare.csv")
    steps = pd.read_csv(d / "compare" / "compare_steps.csv")
    sat = m[m["point"].str.startswith("sat/") & (m["metric"] == "throughput_rps")]
    below = m[m["point"].str.startswith("val/") & m["metric"].isin(JUDGED)]
    w = steps["steps"]
    fit = json.loads(profile.read_text())
    return {"shape": name, "capacity_rps": round(capacity, 3),
            "step_median_pct": round(float((steps["median_ape_pct"] * w).sum() / w.sum()), 2),
            "step_p90_pct": round(float((steps["p90_ape_pct"] * w).sum() / w.sum()), 2),
            "sat_throughput_err_pct": round(float(sat["err_to_median_pct"].iloc[0]), 2),
            "below_in_range": f"{int(below['in_range'].sum())}/{len(below)}",
            "below_within_5pct": f"{int((below['err_to_median_pct'].abs() <= 5).sum())}/{len(below)}",
            "below_median_abs_err_pct": round(float(below["err_to_median_pct"].abs().median()), 2),
            "real_spread_median_pct": round(float(below["real_spread_pct"].median()), 2),
            "fit_cv_step_median_pct": fit["held_out"].get("step_median_ape_pct"),
            "request_latency_ms": round(fit.get("request_latency_s", 0) * 1e3, 3),
            "profile": profile.name}


def _models(text: str) -> list[str]:
    # --models: comma-separated names of SHAPES
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown model shape {', '.join(unknown) or repr(text)}; "
                                         f"known: {', '.join(SHAPES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m benchmarks.vllm_fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/vllm-fidelity")
    ap.add_argument("--models", type=_models, default="tiny,wide8", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--num-requests", type=positive_int, default=48)
    ap.add_argument("--calib-repeats", type=positive_int, default=2,
                    help="repeats of each calibration point, round robin (averages the machine's drift)")
    args = ap.parse_args(argv)
    try:
        out = out_dir(args.out, create=True)
    except OutputError as e:
        return refuse(e)
    rows = []
    t0 = time.time()
    for name in args.models:
        rows.append(one_shape(name, SHAPES[name], out, args))
        say(f"{name}: {rows[-1]}")
    df = pd.DataFrame(rows)
    text = ("# Fidelity against real vLLM V1 (CPU)\n\n" + md_table(df) +
            f"\n\nWall time {time.time() - t0:.0f} s. Command: python benchmarks/vllm_fidelity.py "
            + " ".join(sys.argv[1:] if argv is None else argv) + "\n")
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    run_main(main, kept="each finished run stays in its folder; rerun the same command to resume")
