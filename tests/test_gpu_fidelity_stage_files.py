"""benchmarks.gpu_fidelity on stage files other than the H100 one: each row is replayed on the GPU and with the
engine settings its columns (else its file's name, else the H100 README) give, and a row that cannot be
replayed is kept with the reason, never simulated on another GPU."""
from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import gpu_fidelity, shared_data
from costmodels.catalog import get_model
from fidelity.vllm_stages import catalog_gpu, gpu_in_file_name, row_settings, stage_profile
from tests.test_gpu_fidelity_benchmark import STAGE

H100_FILE = next((c / gpu_fidelity.STAGES_CSV for c in shared_data.SHARED_CANDIDATES
                  if (c / gpu_fidelity.STAGES_CSV).exists()), None)


@pytest.fixture(autouse=True)
def no_shared_folder(monkeypatch):
    """The named stage files alone: ../shared's own runs are not replayed beside them."""
    monkeypatch.setattr(shared_data, "SHARED_CANDIDATES", ())


@pytest.mark.parametrize("written, name", [
    ("A100-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("L40S", "l40s"), ("H100 SXM", "h100-sxm"),
    ("H100-80GB-HBM3", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("H200", "h200-sxm")])
def test_gpu_names_as_people_write_them(written, name):
    assert catalog_gpu(written) == (name, "")


def test_an_a100_without_its_memory_or_an_unknown_gpu_is_a_reason_not_a_guess():
    gpu, why = catalog_gpu("A100")
    assert gpu is None and "40 GB or 80 GB" in why
    gpu, why = catalog_gpu("TPU-v5e")
    assert gpu is None and "'TPU-v5e' is not in the catalog" in why


def test_the_gpu_and_version_in_a_file_name():
    assert gpu_in_file_name("vllm-0.15.1-h100-stages.csv") == "h100"
    assert gpu_in_file_name("vllm-0.15.1-a100-80gb-stages.csv") == "a100-80gb"
    assert gpu_in_file_name("vllm-0.15.1-l40s-stages.csv") == "l40s"
    assert gpu_in_file_name("vllm-0.15.1-more-stages.csv") is None
    assert row_settings(pd.Series({**STAGE, "stage_file": "vllm-0.16.0-l40s-stages.csv"}))["vllm_version"] == "0.16.0"


def test_a_profile_the_row_disagrees_with_or_does_not_name_is_rebuilt_from_the_row():
    assert stage_profile(pd.Series(STAGE))["source"] == "general"
    short = stage_profile(pd.Series({**STAGE, "sent": 600, "requested_rate_per_s": 2.0}))   # 300 s, not 600
    assert short["duration_s"] == 300 and short["requested_output"] is None and "disagree" in short["source"]
    chat = stage_profile(pd.Series({**STAGE, "profile": "chat"}))
    assert chat["duration_s"] == 600 and "'chat' unknown" in chat["source"]
    point = gpu_fidelity.stage_point(pd.Series({**STAGE, "profile": "chat"}), 600.0)
    assert point["workload"]["output_tokens"]["value"] == 210   # the counted mean: no requested length known


def test_an_fp8_checkpoint_is_simulated_with_fp8_weights():
    from experiments.config import resolve_point
    point = gpu_fidelity.stage_point(pd.Series({**STAGE, "model": "meta-llama/Llama-2-7b-FP8"}), 600.0)
    # costmodels resolves the id to the catalog's llama-2-7b with the checkpoint's FP8 weights
    assert get_model(point["model"]).name == "llama-2-7b" and "quantization" not in point
    cfg = resolve_point(point)
    assert cfg.deployment.weight_format(cfg.model) == "fp8"
    plain = resolve_point(gpu_fidelity.stage_point(pd.Series(STAGE), 600.0))
    assert plain.deployment.weight_format(plain.model) == "fp16"


def replay_args(tmp_path, rows: list[dict], name: str) -> list[str]:
    """gpu_fidelity's arguments replaying `rows`, written as a stage file `name`, with the prior, 2 s a stage."""
    path = tmp_path / name
    pd.DataFrame(rows).to_csv(path, index=False)
    return ["--stages", str(path), "--out", str(tmp_path / "out"),
            "--models", "roofline", "--max-stage-s", "2", "--sets", "h100"]


def replay(tmp_path, rows: list[dict], name: str) -> pd.DataFrame:
    """The stages.csv of replaying `rows` (replay_args), by run."""
    assert gpu_fidelity.main(replay_args(tmp_path, rows, name)) == 0
    return pd.read_csv(tmp_path / "out" / "stages.csv").set_index("run")


def test_rows_on_other_gpus_with_their_own_settings(tmp_path, capsys):
    rows = [{**STAGE, "experiment": "a100-row", "gpu": "A100-80GB", "max_num_batched_tokens": 1024},
            {**STAGE, "experiment": "l40s-row"},                               # the GPU from the file's name
            {**STAGE, "experiment": "tpu-row", "gpu": "TPU-v5e"},
            {**STAGE, "experiment": "unknown-model-row", "model": "acme/Nonexistent-7B"},
            {**STAGE, "experiment": "too-big-row", "model": "meta-llama/Llama-2-70b-hf"},   # 138 GB on 48 GB
            {**STAGE, "experiment": "no-tp-row", "tensor_parallel_size": None}]
    path, out = tmp_path / "vllm-0.15.1-l40s-stages.csv", tmp_path / "out"
    s = replay(tmp_path, rows, path.name)
    assert s.loc["a100-row", "gpu"] == "a100-80gb" and s.loc["a100-row", "max_num_batched_tokens"] == 1024
    assert s.loc["l40s-row", "gpu"] == "l40s" and s.loc["l40s-row", "max_num_batched_tokens"] == 2048
    assert (s.loc[["a100-row", "l40s-row"], "stage_file"] == path.name).all()
    assert s.loc[["a100-row", "l40s-row"], "skipped"].isna().all()
    assert (s.loc[["a100-row", "l40s-row"], "sim_per_token_ms"] > 0).all()
    assert s.loc["a100-row", "sim_per_token_ms"] != s.loc["l40s-row", "sim_per_token_ms"]
    assert "'TPU-v5e' is not in the catalog" in s.loc["tpu-row", "skipped"]
    assert "acme/Nonexistent-7B" in s.loc["unknown-model-row", "skipped"]
    assert "no memory left for the KV cache" in s.loc["too-big-row", "skipped"]
    assert s.loc["no-tp-row", "skipped"] == "tensor_parallel_size is empty"
    assert s.loc[["tpu-row", "unknown-model-row", "too-big-row", "no-tp-row"], "sim_per_token_ms"].isna().all()
    report = (out / "report.md").read_text()
    assert f"| {path.name} | a100-80gb | roofline |" in report and f"| {path.name} | l40s | roofline |" in report
    assert "tpu-row stage_0: skipped: GPU 'TPU-v5e'" in report


def test_a_stage_file_without_a_needed_column_is_one_line(tmp_path, capsys):
    path = tmp_path / "vllm-0.15.1-l40s-stages.csv"
    pd.DataFrame([{k: v for k, v in STAGE.items() if k != "sent"}]).to_csv(path, index=False)
    for arg in (str(path), str(tmp_path / "missing.csv")):
        with pytest.raises(SystemExit) as e:
            gpu_fidelity.main(["--stages", arg, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and ("'sent'" in err or "missing.csv" in err)


def test_a_figure_the_run_did_not_measure_leaves_out_its_comparison_not_the_stage(tmp_path):
    """Stage files of other runs may lack a figure (a column, or a cell: a stage whose every request timed out
    has no latency): the stage is still replayed and classed, only that comparison is left out; per token
    falls back to its definition, (E2E - TTFT) / (output - 1)."""
    drop = ("per_token_ms_counted", "e2e_p99_ms")
    stage = {**{k: v for k, v in STAGE.items() if k not in drop}, "model": "meta-llama/Llama-3.1-8B-Instruct"}
    rows = [{**stage, "experiment": "measured"},
            {**stage, "experiment": "all-timed-out", "ok": 0, "failed": 1200, "ttft_mean_ms": None,
             "ttft_p99_ms": None, "e2e_mean_ms": None, "output_tok_per_s": 0},
            {**stage, "experiment": "no-knee-figures", "failed": None, "ttft_p99_ms": None}]
    s = replay(tmp_path, rows, "vllm-0.15.1-h100-more-stages.csv")
    assert s["skipped"].isna().all() and (s["sim_per_token_ms"] > 0).all()
    assert s.loc["measured", "real_per_token_ms"] == pytest.approx((2057.6 - 27.1) / (210 - 1))
    assert s["real_e2e_p99_ms"].isna().all() and s["err_e2e_p99_ms"].isna().all()
    assert list(s["real_class"]) == ["sustained", "saturated", "unknown"]
    assert s.loc["all-timed-out", ["real_ttft_mean_ms", "err_ttft_mean_ms", "real_per_token_ms"]].isna().all()
    # the stage with no knee figure counts in no class comparison, whatever the simulator said of it
    assert gpu_fidelity.summary(s.reset_index())["wrong_class"].iloc[0] == int(s.loc["all-timed-out", "sim_class"] != "saturated")


def test_an_interrupted_replay_keeps_the_stages_it_finished(tmp_path, monkeypatch, capsys):
    from commandline.exits import guarded
    stage_rows, calls = gpu_fidelity.stage_rows, []

    def ctrl_c_in_the_second_stage(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return stage_rows(*args)
    monkeypatch.setattr(gpu_fidelity, "stage_rows", ctrl_c_in_the_second_stage)
    argv = replay_args(tmp_path, [{**STAGE, "experiment": f"run-{i}"} for i in range(3)], "vllm-0.15.1-h100-stages.csv")
    assert guarded(gpu_fidelity.main, argv, kept="kept") == 130
    kept = pd.read_csv(tmp_path / "out" / "stages.csv")
    assert list(kept["run"]) == ["run-0"] and kept["sim_per_token_ms"].iloc[0] > 0
    assert "interrupted: kept" in capsys.readouterr().err


def test_a_stage_file_that_measured_nothing_is_one_line(tmp_path, capsys):
    from fidelity.vllm_stages import MEASURED
    path = tmp_path / "vllm-0.15.1-l40s-stages.csv"
    pd.DataFrame([{k: v for k, v in STAGE.items() if k not in MEASURED}]).to_csv(path, index=False)
    with pytest.raises(SystemExit) as e:
        gpu_fidelity.main(["--stages", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "no measured column" in err
    s = replay(tmp_path, [{**STAGE, **{k: None for k in MEASURED}}], path.name)   # the columns, no figures
    assert "no measured figure" in s["skipped"].iloc[0]


@pytest.mark.skipif(H100_FILE is None, reason="no ../shared/real-runs")
def test_the_h100_file_replays_as_its_readme_says():
    table = pd.read_csv(H100_FILE).assign(stage_file=H100_FILE.name)
    engine = {"policy": "chunked_prefill", "max_num_seqs": 128, "max_num_batched_tokens": 2048, "max_model_len": 4096,
              "enable_prefix_caching": True, "gpu_memory_utilization": 0.9, "kv_offload": {"cpu_gb": 8},
              "vllm_version": "0.15.1"}   # the run's release: its admission and free-queue rules
    for _, r in table.iterrows():
        assert stage_profile(r)["source"] == r["profile"]
        point = gpu_fidelity.stage_point(r, 600.0)
        assert (point["hardware"], point["dtype"], point["engine"]) == ("h100-sxm", "fp16", engine)
        assert "quantization" not in point


def test_headers_match_whatever_their_case_and_the_experiment_may_name_the_gpu(tmp_path):
    from fidelity.vllm_stages import StageFileError, read_stage_file
    f = tmp_path / "vllm-0.15.1-more-stages.csv"
    pd.DataFrame([{**STAGE, "GPU Type": "L40S", "Max-Num-Batched-Tokens": 1024},
                  {**STAGE, "experiment": "llama-3.1-8b-a100-80gb-tp1-general", "GPU Type": None}]).to_csv(f, index=False)
    rows = read_stage_file(f)
    first, second = (row_settings(r) for _, r in rows.iterrows())
    assert (first["gpu"], first["max_num_batched_tokens"]) == ("l40s", 1024)
    assert second["gpu"] == "a100-80gb"   # no GPU cell: the experiment's name says it, before the file's name
    assert row_settings(pd.Series(STAGE))["gpu"] == "h100-sxm"   # the H100 file's names hold no GPU
    pd.DataFrame([{**STAGE, "gpu": "L40S", "GPU": "H100"}]).to_csv(f, index=False)
    with pytest.raises(StageFileError, match="two columns read as 'gpu'"):
        read_stage_file(f)


def test_kv_offload_turns_the_hybrid_manager_off_before_vllm_0_22():
    # vLLM before 0.22 turned its hybrid KV cache manager off whenever a KV connector was set (the runs' KV
    # CPU offloading is one); 0.22 keeps it on for connectors that support it, as the OffloadingConnector
    # does, which the simulator does not model beside offloading: the row's own release decides
    from experiments.config import resolve_point
    from experiments.kv_groups import point_kv_groups
    from simcore.errors import SimulationError
    row = pd.Series({**STAGE, "model": "openai/gpt-oss-20b", "gpu": "L40S"})
    old = gpu_fidelity.stage_point(row, 600.0)
    assert old["engine"]["kv_offload"] == {"cpu_gb": 8} and old["engine"]["vllm_version"] == "0.15.1"
    assert point_kv_groups(resolve_point(old)) is None   # every layer counted whole
    new = gpu_fidelity.stage_point(pd.Series({**row, "vllm_version": "0.22.0"}), 600.0)
    with pytest.raises(SimulationError, match="not modelled with engine.kv_offload"):
        point_kv_groups(resolve_point(new))
    none = gpu_fidelity.stage_point(pd.Series({**row, "kv_offload_gb": 0}), 600.0)
    assert "kv_offload" not in none["engine"] and point_kv_groups(resolve_point(none)) is not None


def test_run_table_columns_dp_mbt_kv_offload_and_precision():
    """The columns inference-perf run tables note (`dp`, `mbt`, `cpu_offload` true/false for the KV offloading,
    `precision`): DP ranks replay as replicas behind vLLM's least-loaded balancer, the rest as the engine
    settings they name; a value that says neither is a reason, not a guess."""
    row = pd.Series({**STAGE, "model": "meta-llama/Llama-4-Scout-17B-16E-Instruct", "tensor_parallel_size": 2,
                     "dp": 2, "mbt": 1024, "cpu_offload": "false", "precision": "FP8"})
    s = row_settings(row)
    assert (s["data_parallel_size"], s["max_num_batched_tokens"], s["kv_offload_gb"], s["quantization"]) == (2, 1024, 0, "fp8")
    point = gpu_fidelity.stage_point(row, 600.0, s)
    assert point["data_parallel_size"] == 2 and point["cluster"] == {"num_replicas": 2, "router": "vllm_dp"}
    assert "kv_offload" not in point["engine"] and point["quantization"] == "fp8"
    assert point["engine"]["max_num_batched_tokens"] == 1024
    on = row_settings(pd.Series({**STAGE, "cpu_offload": True, "precision": "BF16"}))
    assert (on["kv_offload_gb"], on["dtype"], on["quantization"], on["data_parallel_size"]) == (8, "bf16", None, 1)
    assert "cluster" not in gpu_fidelity.stage_point(pd.Series(STAGE), 600.0)
    assert "not true or false" in row_settings(pd.Series({**STAGE, "cpu_offload": "sometimes"}))["skipped"]
    assert "precision 'int3'" in row_settings(pd.Series({**STAGE, "precision": "int3"}))["skipped"]


def test_needed_columns_under_the_names_run_tables_give_them(tmp_path):
    from fidelity.vllm_stages import read_stage_file
    f = tmp_path / "vllm-0.15.1-more-stages.csv"
    row = {("workload" if k == "profile" else "TP" if k == "tensor_parallel_size" else k): v for k, v in STAGE.items()}
    pd.DataFrame([{**row, "HW": "L40S"}]).to_csv(f, index=False)
    r = read_stage_file(f).iloc[0]
    assert (r["profile"], r["tensor_parallel_size"], row_settings(r)["gpu"]) == ("general", 1, "l40s")


# The deployments of the public vLLM 0.15.1 runs on H100, A100 80GB and L40S that inference-sim published
# beside the ones in ../shared (their configuration columns: inference-sim/sim-to-real-accuracy-validation,
# results/cluster_2000req/error_records.csv, and its EXPERIMENT_FIGURE_INCLUSION.md for the FP8 Llama-4-Scout
# runs; no figure of theirs is used here): (model, GPU, TP, DP, precision, budget, memory share, KV offload).
PUBLIC_RUN_DEPLOYMENTS = [
    ("codellama/CodeLlama-34b-Instruct-hf", "H100", 2, None, "FP16", 2048, 0.9, True),
    ("meta-llama/Llama-2-70b-hf", "H100", 4, None, "FP16", 2048, 0.9, True),
    ("mistralai/Mixtral-8x7B-v0.1", "H100", 2, 1, "FP16", 2048, 0.9, True),
    ("Qwen/Qwen3-14B", "H100", 1, None, "FP16", 2048, 0.9, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "H100", 1, None, "FP16", 1024, 0.9, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "H100", 1, None, "FP16", 8192, 0.95, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "H100", 2, None, "FP16", 2048, 0.9, False),
    ("mistralai/Mixtral-8x7B-v0.1", "H100", 2, 1, "FP16", 1024, 0.95, False),
    ("mistralai/Mixtral-8x7B-v0.1", "H100", 4, 1, "FP16", 8192, 0.9, False),
    ("mistralai/Mixtral-8x7B-v0.1", "H100", 2, 2, "FP16", 2048, 0.9, False),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "H100", 8, 1, "FP16", 2048, 0.9, False),
    ("mistralai/Mixtral-8x22B-v0.1", "H100", 8, 1, "FP16", 2048, 0.9, False),
    ("Qwen/Qwen3-14B", "A100-80GB", 1, None, "FP16", 2048, 0.9, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "A100-80GB", 1, None, "FP16", 2048, 0.9, False),
    ("codellama/CodeLlama-34b-Instruct-hf", "A100-80GB", 2, None, "FP16", 2048, 0.9, False),
    ("meta-llama/Llama-2-70b-hf", "A100-80GB", 4, None, "FP16", 2048, 0.9, False),
    ("mistralai/Mixtral-8x7B-v0.1", "A100-80GB", 2, 1, "FP16", 2048, 0.9, False),
    ("Qwen/Qwen3-14B", "L40S", 1, None, "FP16", 2048, 0.9, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "L40S", 1, None, "FP16", 2048, 0.9, False),
    ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "H100", 2, 1, "FP8", 2048, 0.9, False),
    ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "H100", 2, 4, "FP8", 2048, 0.9, False),
    ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "A100-80GB", 2, 1, "FP8", 2048, 0.9, False),
    # the other models inference-sim's training notes name (Mistral-7B at TP 1 and 2; the rest at the TP this
    # file gives their peers: a 34B model on two H100s, a 70B on four)
    ("mistralai/Mistral-7B-Instruct-v0.3", "H100", 1, None, "FP16", 2048, 0.9, False),
    ("mistralai/Mistral-7B-Instruct-v0.3", "H100", 2, None, "FP16", 2048, 0.9, False),
    ("Qwen/Qwen2.5-7B-Instruct", "H100", 1, None, "FP16", 2048, 0.9, False),
    ("01-ai/Yi-34B-Chat", "H100", 2, None, "FP16", 2048, 0.9, False),
    ("meta-llama/Llama-3.1-70B-Instruct", "H100", 4, None, "FP16", 2048, 0.9, False)]


@pytest.mark.parametrize("model, gpu, tp, dp, precision, budget, share, offload", PUBLIC_RUN_DEPLOYMENTS)
def test_every_public_run_deployment_replays_and_fits(tmp_path, model, gpu, tp, dp, precision, budget, share,
                                                     offload):
    """A stage of each deployment, in a file written as the run tables write it, replays on its own GPU with
    its own settings (no reason to skip it), and the KV pool vLLM would size holds a whole 4,096-token
    sequence on every rank: the model fits as it did for vLLM."""
    from experiments.config import resolve_point
    from experiments.simulate import memory_plan
    from fidelity.vllm_stages import read_stage_file
    f = tmp_path / "vllm-0.15.1-public-stages.csv"
    pd.DataFrame([{**{k: v for k, v in STAGE.items() if k != "tensor_parallel_size"}, "model": model, "hardware": gpu,
                   "tp": tp, "dp": dp, "precision": precision, "max_num_batched_tokens": budget,
                   "gpu_mem_util": share, "cpu_offload": offload}]).to_csv(f, index=False)
    row = read_stage_file(f).iloc[0]
    s = row_settings(row)
    assert not s.get("skipped") and s["max_num_batched_tokens"] == budget
    assert (s["data_parallel_size"], s["gpu_memory_utilization"], s["kv_offload_gb"] > 0) == (dp or 1, share, offload)
    point = gpu_fidelity.stage_point(row, 60.0, s)
    cfg = resolve_point(point)
    assert cfg.gpu.name == catalog_gpu(gpu)[0] and cfg.tensor_parallel_size == tp
    assert cfg.deployment.weight_format(cfg.model) == ("fp8" if precision == "FP8" else "fp16")
    assert memory_plan(cfg).kv_capacity_tokens >= 4096
