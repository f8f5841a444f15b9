"""The cost model built from the installed aiconfigurator-core tables (skips without the [aic] extra)."""
from pathlib import Path

import pytest

from costmodels import get_gpu, get_model, load_cost_model
from costmodels.catalog import CatalogError
from costmodels.deployment import Deployment

aic = pytest.importorskip("costmodels.aic")
if aic.tables_root() is None:
    pytest.skip("aiconfigurator-core ([aic] extra) not installed", allow_module_level=True)
pytest.importorskip("pyarrow")
CONFIGS = aic.tables_root().parent.parent / "model_configs"


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BATCHSIM_CACHE", str(tmp_path_factory.getbasetemp() / "aic-cache"))


def test_grid_reproduces_its_rows_and_extrapolates_physically():
    import numpy as np
    pts = np.array([[b, L] for b in (1, 2, 4) for L in (16, 64, 256) if not (b == 4 and L == 256)], dtype=float)
    lat = pts[:, 0] * pts[:, 1] ** 2 * 1e-9
    from costmodels.tablegrid import grid_from_rows
    g = grid_from_rows(("b", "L"), pts, lat, (1.0, 2.0))
    assert all(g(*p) == pytest.approx(t, rel=1e-3) for p, t in zip(pts, lat))
    assert g(4, 256) == pytest.approx(4 * 256**2 * 1e-9, rel=1e-3)   # the missing cell, along L^2


def test_moe_profile_uses_the_tables_and_reports_held_out_error():
    m = get_model(str(CONFIGS / "Qwen--Qwen3-30B-A3B_config.json"))
    cm = load_cost_model(None, m, get_gpu("h100-sxm"))   # no profile: the tables, automatically
    d = cm.describe()
    assert d["kind"] == "aic" and "moe_perf.parquet" in d["family_sources"]["moe"]
    assert d["family_sources"]["alltoall"] == "roofline prior" and "gemm" not in d["family_sources"]
    for family in ("gemm_bf16", "prefill_attn_full", "decode_attn_full", "moe"):
        assert d["held_out_error"][family]["median_pct"] < 10
    steps = [cm.step_time_s(decode=[1024] * b) for b in (1, 8, 64)]
    assert steps == sorted(steps)
    assert cm.decode_step_time_fn(8)(8 * 1024) == cm.step_time_s(decode=[1024] * 8)
    again = load_cost_model("aic:vllm", m, get_gpu("h100-sxm"))   # from the cache
    assert again.step_time_s(prefill=[(2048, 0)]) == cm.step_time_s(prefill=[(2048, 0)])


def test_tp_all_reduce_from_the_comm_tables():
    m = get_model(str(CONFIGS / "meta-llama--Meta-Llama-3.1-70B_config.json"))
    cm = load_cost_model("aic", m, get_gpu("h100-sxm"), deployment=Deployment(tensor_parallel_size=4))
    assert "custom_allreduce_perf" in cm.describe()["family_sources"]["allreduce"]
    assert 0 < cm._allreduce_s(64) < cm._allreduce_s(8192)


def test_unknown_gpu_framework_or_version_lists_what_is_there():
    m = get_model("llama-3-8b")
    with pytest.raises(CatalogError, match="no kernel tables for GPU 'a100-40gb'; available: .*h100-sxm"):
        load_cost_model("aic", m, get_gpu("a100-40gb"))
    with pytest.raises(CatalogError, match="framework 'tgi' on h100_sxm; available: sglang, trtllm, vllm"):
        load_cost_model("aic:tgi", m, get_gpu("h100-sxm"))
    with pytest.raises(CatalogError, match="vllm '0.1' on h100_sxm; available: 0.24.0"):
        load_cost_model("aic:vllm:0.1", m, get_gpu("h100-sxm"))


def test_moe_vs_dense_example_runs_reduced(tmp_path):
    import pandas as pd
    import yaml

    from experiments.run import main
    sweep = yaml.safe_load((Path(__file__).parent.parent / "examples" / "moe_vs_dense_h100.yaml").read_text())
    sweep["workload"]["num_requests"] = 20
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    assert main([str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    res = pd.read_csv(tmp_path / "out" / "results.csv")
    assert set(res["cost_model"]) == {"aic"} and (res["num_finished"] == 20).all()


def test_mla_block_from_the_tables_and_the_ep_exchange_from_the_link():
    m = get_model(str(CONFIGS / "deepseek-ai--DeepSeek-V3_config.json"))
    dp = load_cost_model(None, m, get_gpu("h200-sxm"),
                         deployment=Deployment(data_parallel_size=8, enable_expert_parallel=True))
    src = dp.describe()["family_sources"]
    # the EP dispatch/combine is vLLM's all-gather + reduce-scatter, priced from the link's collective figures
    assert "mla_generation_module" in src["mla_decode_module"] and src["alltoall"] == "roofline prior"
    assert "decode_attn" not in src and dp.attn_gemms == []   # the MLA block rows include its projections
    steps = [dp.step_time_s(decode=[2048] * b) for b in (1, 16, 128)]
    assert steps == sorted(steps)
    skewed = load_cost_model(None, m, get_gpu("h200-sxm"), deployment=Deployment(
        data_parallel_size=8, enable_expert_parallel=True, expert_load_imbalance=1.3))
    assert skewed.step_time_s(decode=[2048] * 64) > dp.step_time_s(decode=[2048] * 64)


def test_baseline_residual_follows_a_kink_a_plain_grid_misses():
    import numpy as np
    from costmodels.tablegrid import family
    import pandas as pd
    b = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256], dtype=float)
    lat_ms = 0.02 + b * 1e-3          # launch-bound, then bandwidth-bound: a bend near b = 20
    rows = pd.DataFrame({"b": b, "latency": lat_ms})
    base = {"flops": [], "bytes": [(1.0, (1,))], "peak_flops_per_s": 1.0, "bytes_per_s": 1e6}
    plain, shaped = family(rows, ("b",), ("b",), (1.0,)), family(rows, ("b",), ("b",), (1.0,), base)
    assert shaped["held_out"]["median_pct"] < plain["held_out"]["median_pct"]


def test_a_weight_format_the_tables_lack_keeps_the_roofline_and_says_so():
    m = get_model(str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B_config.json"))
    nvfp4 = load_cost_model("aic", m, get_gpu("h100-sxm"), deployment=Deployment(quantization="nvfp4"))
    fp8 = load_cost_model("aic", m, get_gpu("h100-sxm"), deployment=Deployment(quantization="fp8"))
    assert nvfp4.describe()["family_sources"]["gemm_weights"].startswith("roofline prior (no nvfp4")
    assert "gemm_perf" in fp8.describe()["family_sources"]["gemm_weights"]
    bf16 = load_cost_model("aic", m, get_gpu("h100-sxm"))
    assert fp8.step_time_s(decode=[1024] * 8) < bf16.step_time_s(decode=[1024] * 8)


def test_the_gb200_and_rtx_pro_6000_server_tables_are_reachable_and_which_price_by_default():
    m = get_model("llama-3.1-8b")
    for gpu, folder, default in (("gb200", "gb200", True), ("rtx-pro-6000-server", "rtx_pro_6000_server", False)):
        d = load_cost_model("aic", m, get_gpu(gpu)).describe()
        assert d["kind"] == "aic" and d["family_sources"]["gemm_bf16"].startswith(f"aiconfigurator {folder}/gemm/vllm/")
        # the RTX PRO 6000 Server's tables are off by default: the prior is closer to real vLLM runs there
        assert (load_cost_model(None, m, get_gpu(gpu)).describe()["kind"] == "aic") is default
    # the Workstation Edition (1,792 GB/s) is not the Server Edition the tables measured
    with pytest.raises(CatalogError, match="no kernel tables for GPU 'rtx-pro-6000'"):
        load_cost_model("aic", m, get_gpu("rtx-pro-6000"))


def test_a_chunk_after_a_cached_prefix_pays_the_tiles_beyond_the_fresh_prompt_the_table_times():
    # NVIDIA's context-attention tables time fresh prompts: the table prices (new, cached) at the fresh
    # prompts of the same causal work and adds the tile model's extra cost of the prefix, keeping its own
    # fixed time; a fresh chunk is the table's price exactly
    from costmodels.profile import prefill_coords
    from costmodels.roofline import RooflineCostModel
    m = get_model("llama-3.1-8b")
    cm = load_cost_model("aic", m, get_gpu("l40s"))
    grid = cm._g["prefill_attn_full"]
    assert cm._prefill_attention_s([(512, 0)]) == grid(1.0, 512.0)
    b, length = prefill_coords([16], [4096])
    tiles = RooflineCostModel._prefill_attention_s
    step, fresh = tiles(cm, [(16, 4096)]), tiles(cm, [(length, 0)])
    assert step > 3 * fresh   # FA2: one query tile a head walks the whole prefix
    assert cm._prefill_attention_s([(16, 4096)]) == pytest.approx(grid(b, length) + step - fresh, rel=1e-12)
    # where the tiles price the step below its fresh equivalent (FA3 splits a short chunk's walk over idle
    # SMs; a long chunk after a moderate prefix has fewer query tiles) the table's price stands
    h100 = load_cost_model("aic", m, get_gpu("h100-sxm"))
    b, length = prefill_coords([16], [600])
    assert tiles(h100, [(16, 600)]) < tiles(h100, [(length, 0)])
    assert h100._prefill_attention_s([(16, 600)]) == h100._g["prefill_attn_full"](b, length)
    b, length = prefill_coords([2048], [2048])
    assert tiles(cm, [(2048, 2048)]) < tiles(cm, [(length, 0)])
    assert cm._prefill_attention_s([(2048, 2048)]) == grid(b, length)
