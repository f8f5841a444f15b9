"""Model families from config.json, precision and parallelism: weights, KV bytes, roofline terms, errors."""
import json
from pathlib import Path

import pytest

from costmodels import RooflineCostModel, get_gpu, get_model
from costmodels.catalog import CatalogError
from costmodels.deployment import Deployment, check, kv_bytes_per_token, weight_bytes_per_gpu

H100 = get_gpu("h100-sxm")
BASE = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 2048}
TINY_MOE = {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "head_dim": 128, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128, "decoder_sparse_step": 1, "mlp_only_layers": [0]}
TINY_MLA = {**BASE, "architectures": ["DeepseekV3ForCausalLM"], "num_key_value_heads": 4, "kv_lora_rank": 64,
            "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "q_lora_rank": 96,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1}


def write(tmp_path: Path, cfg: dict, name="config.json") -> str:
    f = tmp_path / name
    f.write_text(json.dumps(cfg))
    return str(f)


def aic_configs() -> Path:
    from costmodels.aic import tables_root
    root = tables_root()
    if root is None:
        pytest.skip("aiconfigurator-core ([aic] extra) not installed")
    return root.parent.parent / "model_configs"


def test_explicit_head_dim_sets_kv_bytes(tmp_path):
    m = get_model(write(tmp_path, {**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 128}))
    assert m.head_dim == 128 and m.family == "dense"
    assert m.kv_bytes_per_token(2) == 4 * 2 * 2 * 128 * 2   # layers x K,V x kv heads x head_dim x bf16
    assert kv_bytes_per_token(m, Deployment(kv_cache_dtype="fp8")) == m.kv_bytes_per_token(2) // 2


def test_tiny_moe_counts_experts_and_dense_layers(tmp_path):
    m = get_model(write(tmp_path, TINY_MOE))
    assert (m.family, m.num_experts, m.experts_per_token, m.num_moe_layers, m.num_dense_layers) == ("moe", 8, 2, 3, 1)
    p = m.param_counts()
    assert p["experts"] == 3 * 8 * 3 * 256 * 128 and p["dense_mlp"] == 1 * 3 * 256 * 512
    assert m.num_active_params < m.num_params


def test_tiny_mla_kv_is_the_latent_and_not_split_by_tp(tmp_path):
    m = get_model(write(tmp_path, TINY_MLA))
    assert m.family == "mla-moe" and m.num_moe_layers == 3 and m.shared_expert_intermediate_size == 128
    assert kv_bytes_per_token(m, Deployment()) == 4 * (64 + 16) * 2
    assert kv_bytes_per_token(m, Deployment(tensor_parallel_size=2)) == 4 * (64 + 16) * 2


def test_unknown_architecture_and_missing_family_key_are_one_line_errors(tmp_path):
    with pytest.raises(CatalogError, match="architecture 'MambaForCausalLM' is not modelled"):
        get_model(write(tmp_path, {**BASE, "architectures": ["MambaForCausalLM"]}))
    bad = {k: v for k, v in TINY_MOE.items() if k != "num_experts_per_tok"}
    with pytest.raises(CatalogError, match="lacks required key 'num_experts_per_tok' \\(MoE model\\)"):
        get_model(write(tmp_path, bad))
    with pytest.raises(CatalogError, match="lacks required key 'kv_lora_rank' \\(MLA model\\)"):
        get_model(write(tmp_path, {k: v for k, v in TINY_MLA.items() if k != "kv_lora_rank"}))


def test_parallelism_errors_name_the_knob(tmp_path):
    moe = get_model(write(tmp_path, TINY_MOE))
    with pytest.raises(CatalogError, match="tensor_parallel_size: 3 does not divide 4 attention heads"):
        check(moe, Deployment(tensor_parallel_size=3))
    with pytest.raises(CatalogError, match="pipeline_parallel_size: 5 exceeds .* 4 layers"):
        check(moe, Deployment(pipeline_parallel_size=5))
    with pytest.raises(CatalogError, match="enable_expert_parallel: 3 ranks .* do not divide 8 experts"):
        check(moe, Deployment(data_parallel_size=3, enable_expert_parallel=True))
    check(moe, Deployment(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True))


def test_precision_and_expert_parallel_shrink_weights(tmp_path):
    m = get_model(write(tmp_path, TINY_MOE))
    bf16 = weight_bytes_per_gpu(m, Deployment())
    assert weight_bytes_per_gpu(m, Deployment(quantization="fp8")) < 0.75 * bf16
    ep = weight_bytes_per_gpu(m, Deployment(data_parallel_size=4, enable_expert_parallel=True))
    assert ep == pytest.approx(bf16 - m.param_counts()["experts"] * 2 * 3 / 4)


def test_roofline_moe_reads_more_experts_as_the_batch_grows(tmp_path):
    m = get_model(write(tmp_path, TINY_MOE))
    cm = RooflineCostModel(m, H100)
    steps = [cm.step_time_s(decode=[512] * b) for b in (1, 4, 16, 64)]
    assert steps == sorted(steps)
    ep = RooflineCostModel(m, H100, deployment=Deployment(data_parallel_size=2, enable_expert_parallel=True))
    skew = RooflineCostModel(m, H100, deployment=Deployment(data_parallel_size=2, enable_expert_parallel=True,
                                                            expert_load_imbalance=1.5))
    assert skew.step_time_s(prefill=[(4096, 0)]) > ep.step_time_s(prefill=[(4096, 0)])


def test_compute_bound_experts_run_at_the_fused_moe_kernels_efficiency(tmp_path):
    # hidden 4,096, expert width 1,024, top-2 of 8, one H100: 16,384 tokens route 32,768 token-expert rows,
    # 2 x 32,768 x 3 x 4,096 x 1,024 = 824.6 GFLOP at 0.46 of 989 TFLOP/s = 1.81 ms; the bytes (201 MB of
    # experts, 738 MB of activations) take 0.34 ms, so the ridge adds 0.2%. Dense GEMMs keep the H100's 0.81.
    from costmodels.roofline import Efficiencies
    m = get_model(write(tmp_path, {**TINY_MOE, "hidden_size": 4096, "moe_intermediate_size": 1024,
                                   "num_attention_heads": 32, "num_key_value_heads": 8}))
    cm = RooflineCostModel(m, H100)
    compute_s = 2 * 32768 * 3 * 4096 * 1024 / (H100.bf16_flops_per_s * 0.46)
    assert compute_s < cm._routed_experts_s(16384) < 1.005 * compute_s
    assert cm.eff.moe_compute == 0.46 and cm.eff.gemm_compute_on(H100) == 0.81
    dense_like = RooflineCostModel(m, H100, eff=Efficiencies(moe_compute=0.80))
    # the dense figure prices it 0.80 / 0.46 faster, less the ridge's 1% there (compute 3x the bytes' time)
    assert cm._routed_experts_s(16384) / dense_like._routed_experts_s(16384) == pytest.approx(0.80 / 0.46, rel=0.015)
    # a decode-sized batch reads the experts' weights: the compute figure does not move it
    assert cm._routed_experts_s(8) == pytest.approx(dense_like._routed_experts_s(8), rel=1e-3)


def test_fp8_experts_run_at_the_fp8_moe_kernels_figures(tmp_path):
    # The same MoE with FP8 weights (W8A8) on an H100: 16,384 tokens, 824.6 GFLOP at 0.30 of the FP8 peak
    # (1,979 TFLOP/s) = 1.389 ms; the bytes, 100.7 MB of FP8 experts and 738 MB of bf16 activations, at 0.76
    # of DRAM take 0.330 ms; the ridge (exponent 3) adds 0.4%, two launches 4 us: 1.399 ms. Decode: 8 tokens route 16 rows to 7.06
    # of the 8 experts on average, 88.8 MB of weights + 0.4 MB of activations at 0.76 of DRAM, 35.0 us, + 4 us:
    # 39.0 us (the 16-bit figure, 0.83, would give 36.1).
    from costmodels.roofline import Efficiencies, _ridge
    e = Efficiencies()
    m = get_model(write(tmp_path, {**TINY_MOE, "hidden_size": 4096, "moe_intermediate_size": 1024,
                                   "num_attention_heads": 32, "num_key_value_heads": 8}))
    cm = RooflineCostModel(m, H100, deployment=Deployment(quantization="fp8"))
    assert (e.moe_fp8_compute, e.moe_fp8_memory) == (0.30, 0.76)
    flops, rows = 2 * 32768 * 3 * 4096 * 1024, 32768
    weights = 8 * 3 * 4096 * 1024 * 1.0
    memory = (weights + rows * (2 * 4096 + 3 * 1024) * 2) / (3350e9 * 0.76)
    expected = _ridge(flops / (1979e12 * 0.30), memory, 3.0) + 2 * e.kernel_launch_s
    assert cm._routed_experts_s(16384) == pytest.approx(expected, rel=1e-9)
    assert cm._routed_experts_s(16384) == pytest.approx(1.399e-3, rel=1e-3)
    active = 8 * (1 - (1 - 1 / 8) ** 16)
    decode = (active * 3 * 4096 * 1024 + 16 * (2 * 4096 + 3 * 1024) * 2) / (3350e9 * 0.76)
    assert cm._routed_experts_s(8) == pytest.approx(_ridge(2 * 16 * 3 * 4096 * 1024 / (1979e12 * 0.30), decode, 3.0)
                                                    + 2 * e.kernel_launch_s, rel=1e-9)
    assert cm._routed_experts_s(8) == pytest.approx(39.0e-6, rel=2e-3)
    # an A100 has no FP8 tensor cores: vLLM runs the experts through Marlin, at the 16-bit figures
    a100 = get_gpu("a100-80gb")
    marlin = RooflineCostModel(m, a100, deployment=Deployment(quantization="fp8"))
    assert marlin._routed_experts_s(16384) == pytest.approx(
        _ridge(flops / (a100.bf16_flops_per_s * 0.46), (weights + rows * (2 * 4096 + 3 * 1024) * 2)
               / (a100.hbm_bytes_per_s * 0.83), 3.0) + 2 * e.kernel_launch_s, rel=1e-9)


def test_ep_exchange_is_vllms_all_gather_and_reduce_scatter_over_the_dp_ranks(tmp_path):
    # vLLM's default EP all2all (allgather_reducescatter): every DP rank's tokens gathered, the experts'
    # outputs reduce-scattered, each one ring over the DP ranks. Tiny MoE (hidden 256, top-2, bf16), 3 MoE
    # layers, DP 2 on two RTX PRO 6000 Server with P2P (64e9 B/s x 0.59, 14.2 us a collective: collectives.py):
    # 100 tokens gather 100 x (512 + 2 x 8) = 52,800 B and scatter 100 x 512 = 51,200 B:
    # 104,000 / 37.76e9 = 2.754 us, + 2 x 14.2 us per layer, x 3 MoE layers.
    m = get_model(write(tmp_path, TINY_MOE))
    gpu = get_gpu("rtx-pro-6000-server")
    cm = RooflineCostModel(m, gpu, deployment=Deployment(data_parallel_size=2, enable_expert_parallel=True))
    per_layer = 104_000 / (64e9 * 0.59) + 2 * 14.2e-6
    assert cm.step_terms_s(prefill=[(100, 0)])["alltoall"] == pytest.approx(3 * per_layer, rel=1e-12)
    # the top-k does not multiply what crosses the link (the gather carries each token once), and EP over
    # the TP ranks alone exchanges nothing: every TP rank holds the tokens, the TP all-reduce sums the outputs
    tp_ep = RooflineCostModel(m, gpu, deployment=Deployment(tensor_parallel_size=2, enable_expert_parallel=True))
    assert tp_ep.step_terms_s(prefill=[(100, 0)])["alltoall"] == 0.0
    four = RooflineCostModel(m, gpu, deployment=Deployment(data_parallel_size=4, enable_expert_parallel=True))
    per_layer4 = 3 * 104_000 / (64e9 * 0.415) + 2 * 29.8e-6   # (4 - 1) x the bytes, the TP 4 PCIe figures
    assert four.step_terms_s(prefill=[(100, 0)])["alltoall"] == pytest.approx(3 * per_layer4, rel=1e-12)


def test_dp_without_ep_shards_every_expert_over_the_tp_x_dp_ranks(tmp_path):
    """vLLM without expert parallelism flattens the experts' TP across the DP ranks (FusedMoEParallelConfig.make:
    at TP 2, DP 2 "the tensors are sharded across 4 devices"): each GPU holds a quarter of every expert and runs
    it over both DP ranks' tokens, gathered and scattered as with EP (naive dispatch whenever DP > 1)."""
    m = get_model(write(tmp_path, TINY_MOE))
    experts = m.param_counts()["experts"] * 2
    tp2 = Deployment(tensor_parallel_size=2)
    dp2 = Deployment(tensor_parallel_size=2, data_parallel_size=2)
    assert dp2.expert_tp == 4 and tp2.expert_tp == 2
    assert Deployment(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True).expert_tp == 1
    assert weight_bytes_per_gpu(m, tp2) - weight_bytes_per_gpu(m, dp2) == pytest.approx(experts / 2 - experts / 4)
    # 1,024 tokens a rank, top-2: 4,096 token-expert rows over both ranks' tokens at a quarter of the width
    # (32 of 128): 2 x 4,096 x 3 x 256 x 32 FLOPs, the same as TP 2 alone over its own 2,048 rows at 64
    cm, alone = RooflineCostModel(m, H100, tp=2, deployment=dp2), RooflineCostModel(m, H100, tp=2, deployment=tp2)
    flops = 2 * 4096 * 3 * 256 * 32
    assert flops == 2 * 2048 * 3 * 256 * 64
    assert cm.step_terms_s(prefill=[(1024, 0)])["alltoall"] > 0.0
    assert alone.step_terms_s(prefill=[(1024, 0)])["alltoall"] == 0.0
    # decode at one sequence a rank: half the expert bytes per GPU, so the weight-bound experts take less
    assert cm._routed_experts_s(1) < alone._routed_experts_s(1)


def test_w8a8_int8_reads_one_byte_a_weight_at_the_int8_tensor_core_rate(tmp_path):
    """INT8 runs at the FP8 rate where the GPU has FP8 (H100: 1,979 TOPS) and at twice the 16-bit rate before
    it (A100: 624 TOPS); its weights are one byte, as FP8's."""
    m = get_model(write(tmp_path, BASE))
    a100 = get_gpu("a100-80gb")
    assert H100.peak_flops_per_s("int8") == H100.fp8_flops_per_s and a100.peak_flops_per_s("int8") == 624e12
    int8, fp8 = Deployment(quantization="int8"), Deployment(quantization="fp8")
    assert weight_bytes_per_gpu(m, int8) == weight_bytes_per_gpu(m, fp8)
    assert RooflineCostModel(m, a100, deployment=int8).peak_flops == 2 * RooflineCostModel(m, a100).peak_flops
    assert RooflineCostModel(m, H100, deployment=int8).peak_flops == RooflineCostModel(m, H100, deployment=fp8).peak_flops


def test_roofline_bitwise_paths_hold_for_every_family(tmp_path):
    for cfg in (TINY_MOE, TINY_MLA, {**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 256}):
        cm = RooflineCostModel(get_model(write(tmp_path, cfg)), H100)
        ctx = [100, 700, 3000]
        one = cm.step_time_s(decode=ctx)
        assert cm.decode_step_time_fn(3)(sum(ctx)) == one
        assert cm.decode_steps_time_s(3, [float(sum(ctx))])[0] == one


def test_real_configs_from_the_tables_package():
    root = aic_configs()
    q30 = get_model(str(root / "Qwen--Qwen3-30B-A3B_config.json"))
    assert (q30.num_experts, q30.experts_per_token, q30.head_dim) == (128, 8, 128)
    assert q30.num_params / 1e9 == pytest.approx(30.5, abs=0.3)
    ds = get_model(str(root / "deepseek-ai--DeepSeek-V3_config.json"))
    assert ds.family == "mla-moe" and ds.num_moe_layers == 58 and ds.quantization == "fp8_block"
    assert ds.num_params / 1e9 == pytest.approx(671, abs=3) and ds.num_active_params / 1e9 == pytest.approx(37, abs=1.5)
    oss = get_model(str(root / "openai--gpt-oss-120b_config.json"))
    assert (oss.sliding_window, oss.num_sliding_layers, oss.quantization) == (128, 18, "mxfp4")
    scout = get_model(str(root / "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json"))
    llama = get_model(str(root / "meta-llama--Meta-Llama-3.1-8B_config.json"))
    assert scout.num_active_params / 1e9 == pytest.approx(17, abs=1.5) and llama.family == "dense"
    mixtral = get_model(str(root / "mistralai--Mixtral-8x7B-v0.1_config.json"))
    assert mixtral.num_params / 1e9 == pytest.approx(46.7, abs=0.3)


def test_tiny_moe_and_mla_run_end_to_end_through_experiments_run(tmp_path):
    import pandas as pd
    import yaml

    from experiments import run
    from experiments.config import ConfigError, resolve_point
    for name, cfg, extra in (("moe", TINY_MOE, {"tensor_parallel_size": 2, "data_parallel_size": 2,
                                                 "enable_expert_parallel": True, "expert_load_imbalance": 1.2}),
                             ("mla", TINY_MLA, {"kv_cache_dtype": "fp8", "quantization": "fp8"})):
        sweep = {"name": name, "seeds": [0], "model": write(tmp_path, cfg, f"{name}.json"), "hardware": "l40s",
                 "profile": "roofline", **extra,
                 "engine": {"policy": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 512},
                 "workload": {"num_requests": 30, "arrival": {"process": "poisson", "rate_per_s": 20},
                              "prompt_tokens": {"dist": "fixed", "value": 100},
                              "output_tokens": {"dist": "fixed", "value": 20}}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(sweep))
        assert run.main([str(tmp_path / f"{name}.yaml"), "--out", str(tmp_path / name), "--jobs", "1"]) == 0
        res = pd.read_csv(tmp_path / name / "results.csv")
        assert res["num_finished"].iloc[0] == 30 and res["cost_model"].iloc[0] == "roofline"
    with pytest.raises(ConfigError, match="enable_expert_parallel: 3 ranks"):
        resolve_point({**sweep, "model": write(tmp_path, TINY_MOE), "data_parallel_size": 3,
                       "enable_expert_parallel": True, "kv_cache_dtype": "auto", "quantization": None})
    with pytest.raises(ConfigError, match="kv_cache_dtype: expected auto"):
        resolve_point({**sweep, "kv_cache_dtype": "int3"})


def test_step_is_the_sum_of_its_documented_terms(tmp_path):
    for cfg, d in ((TINY_MOE, Deployment(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True)),
                   (TINY_MLA, Deployment(pipeline_parallel_size=2, kv_cache_dtype="fp8")),
                   ({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 256}, Deployment())):
        cm = RooflineCostModel(get_model(write(tmp_path, cfg)), H100, deployment=d)
        batch = {"prefill": [(300, 100), (64, 0)], "decode": [50, 900, 4000]}
        terms = cm.step_terms_s(**batch)
        assert sum(terms.values()) == pytest.approx(cm.step_time_s(**batch), rel=1e-12)
        assert all(v >= 0 for k, v in terms.items() if k != "async_overlap")
        # async scheduling: the CPU terms hide behind the GPU's, never more than all of them
        assert -terms["async_overlap"] == pytest.approx(min(terms["per_step"] + terms["per_request"],
                                                            sum(terms.values()) - terms["async_overlap"]
                                                            - terms["per_step"] - terms["per_request"]))
    assert terms["alltoall"] == 0 and terms["routed_experts"] == 0   # dense: no MoE terms
