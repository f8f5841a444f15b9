"""Every command other than experiments.run, given bad input: one line naming the argument or file, exit 2, no
traceback, nothing written. Valid borderline inputs run.

Table-driven like tests/test_bad_inputs.py: each case is (id, command module, arguments, what the error line
must name); `{tmp}` is the test's folder, where `files` wrote the bad inputs, and `{tmp}/out` the output
path each case must leave absent. Each case runs the command's `main(argv)` in-process (the code path of the
command line, without a Python start-up per case); `test_cli_subprocess_one_line` checks a real command.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = "{tmp}/out"
RUN = "{tmp}/ok.json"   # a valid vllm bench serve JSON
CPU = ["--device", "cpu"]
TINY = ["--model", "tiny"]

# (id, module, argv, what the one error line must contain)
CASES = [
    # calibration.capture: numbers, model, TP, output folder, all before any kernel is timed
    ("capture-tp-zero", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--tp", "0"], "--tp"),
    ("capture-tp-word", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--tp", "two"], "--tp"),
    ("capture-tp-not-dividing", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--tp", "3"], "--tp 3"),
    ("capture-repeats-zero", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--repeats", "0"], "--repeats"),
    ("capture-repeats-negative", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--repeats", "-2"], "--repeats"),
    ("capture-threads-zero", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--threads", "0"], "--threads"),
    ("capture-unknown-model", "calibration.capture", ["--model", "gpt-9", *CPU, "--out", OUT], "gpt-9"),
    ("capture-quant-string", "calibration.capture", ["--model", "{tmp}/qstr/config.json", *CPU, "--out", OUT],
     "quantization_config"),
    ("capture-out-is-file", "calibration.capture", [*TINY, *CPU, "--out", "{tmp}/afile"], "--out"),
    ("capture-out-loop", "calibration.capture", [*TINY, *CPU, "--out", "{tmp}/loop"], "loop"),
    ("capture-out-under-file", "calibration.capture", [*TINY, *CPU, "--out", "{tmp}/afile/sub"], "under a file"),
    ("capture-holdout-nan", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--max-holdout-error-pct", "nan"],
     "--max-holdout-error-pct"),
    ("capture-unknown-gpu", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--gpu", "tpu-v5"], "--gpu tpu-v5"),
    ("capture-unknown-arg", "calibration.capture", [*TINY, *CPU, "--out", OUT, "--bogus"], "--bogus"),
    # calibration.fit
    ("fit-missing-folder", "calibration.fit", ["{tmp}/nothing", "--out", "{tmp}/out/p.json"], "nothing"),
    ("fit-unknown-gpu", "calibration.fit", ["{tmp}/meas_neg", "--out", "{tmp}/out/p.json", "--gpu", "tpu-v5"],
     "--gpu tpu-v5"),
    ("fit-out-is-folder", "calibration.fit", ["{tmp}/nothing", "--out", "{tmp}"], "--out"),
    ("fit-out-loop", "calibration.fit", ["{tmp}/nothing", "--out", "{tmp}/loop/p.json"], "loop"),
    ("fit-holdout-negative", "calibration.fit", ["{tmp}/nothing", "--out", "{tmp}/out/p.json",
                                                 "--max-holdout-error-pct", "-1"], "--max-holdout-error-pct"),
    ("fit-holdout-unknown-family", "calibration.fit", ["{tmp}/nothing", "--out", "{tmp}/out/p.json",
                                                       "--max-holdout-error-pct", "gemmm=5"], "gemmm"),
    ("fit-latency-a-word", "calibration.fit", ["{tmp}/meas_word", "--out", "{tmp}/out/p.json"],
     "meas_word/measurements.csv: line 2: latency_s"),
    ("fit-negative-size", "calibration.fit", ["{tmp}/meas_neg", "--out", "{tmp}/out/p.json"],
     "meas_neg/measurements.csv: line 2: m"),
    ("fit-meta-a-list", "calibration.fit", ["{tmp}/meas_meta", "--out", "{tmp}/out/p.json"], "meas_meta/meta.json"),
    # calibration.import_aic
    ("import-tp-zero", "calibration.import_aic", ["--gpu", "h100_sxm", *TINY, "--out", OUT, "--tp", "0"], "--tp"),
    ("import-tp-not-dividing", "calibration.import_aic", ["--gpu", "h100_sxm", *TINY, "--out", OUT, "--tp", "3"],
     "--tp 3"),
    ("import-root-missing", "calibration.import_aic", ["--gpu", "h100_sxm", *TINY, "--out", OUT, "--root",
                                                       "{tmp}/noroot"], "--root"),
    ("import-gpu-unknown", "calibration.import_aic", ["--gpu", "h900", *TINY, "--out", OUT, "--root", "{tmp}"],
     "--gpu h900"),
    # calibration.compare (two cost models)
    ("compare-unknown-profile", "calibration.compare", ["roofline", "no-such-profile"], "no-such-profile"),
    ("compare-unknown-gpu", "calibration.compare", ["roofline", "roofline", *TINY, "--gpu", "tpu-v5"], "tpu-v5"),
    ("compare-unknown-model", "calibration.compare", ["roofline", "roofline", "--model", "gpt-9", "--gpu",
                                                      "h100-sxm"], "gpt-9"),
    ("compare-one-target", "calibration.compare", ["roofline"], "b"),
    # fidelity.fit_engine
    ("fit-engine-threshold-nan", "fidelity.fit_engine", [RUN, "--out", "{tmp}/out/p.json", "--max-step-error-pct",
                                                         "nan"], "--max-step-error-pct"),
    ("fit-engine-threshold-negative", "fidelity.fit_engine", [RUN, "--out", "{tmp}/out/p.json",
                                                              "--max-metric-error-pct", "-5"], "--max-metric-error-pct"),
    ("fit-engine-iterations-zero", "fidelity.fit_engine", [RUN, "--out", "{tmp}/out/p.json", "--replay-iterations",
                                                           "0"], "--replay-iterations"),
    ("fit-engine-out-folder", "fidelity.fit_engine", [RUN, "--out", "{tmp}"], "--out"),
    ("fit-engine-out-under-file", "fidelity.fit_engine", [RUN, "--out", "{tmp}/afile/p.json"], "--out"),
    # fidelity.compare (real runs)
    ("fidelity-compare-out-file", "fidelity.compare", [RUN, "--config", "{tmp}/point.yaml", "--out", "{tmp}/afile"],
     "--out"),
    ("fidelity-compare-config-missing", "fidelity.compare", [RUN, "--config", "{tmp}/nope.yaml", "--out", OUT],
     "nope.yaml"),
    # fidelity.vllm_run
    ("vllm-run-repeats-zero", "fidelity.vllm_run", [*TINY, "--config", "{tmp}/point.yaml", "--out", OUT,
                                                    "--repeats", "0"], "--repeats"),
    ("vllm-run-blocks-negative", "fidelity.vllm_run", [*TINY, "--config", "{tmp}/point.yaml", "--out", OUT,
                                                       "--num-gpu-blocks", "-3"], "--num-gpu-blocks"),
    ("vllm-run-warmup-negative", "fidelity.vllm_run", [*TINY, "--config", "{tmp}/point.yaml", "--out", OUT,
                                                       "--warmup-requests", "-1"], "--warmup-requests"),
    ("vllm-run-out-file", "fidelity.vllm_run", [*TINY, "--config", "{tmp}/point.yaml", "--out", "{tmp}/afile"],
     "--out"),
    ("vllm-run-unknown-model", "fidelity.vllm_run", ["--model", "gpt-9", "--config", "{tmp}/point.yaml", "--out",
                                                     OUT], "gpt-9"),
    ("vllm-run-workload-missing", "fidelity.vllm_run", [*TINY, "--workload", "{tmp}/nope.csv", "--out", OUT],
     "nope.csv"),
    ("vllm-run-workload-bad-value", "fidelity.vllm_run", [*TINY, "--workload", "{tmp}/bad_trace.csv", "--out", OUT],
     "bad_trace.csv: line 3"),
    ("vllm-run-cluster", "fidelity.vllm_run", [*TINY, "--config", "{tmp}/cluster.yaml", "--out", OUT], "cluster"),
    # fidelity.validate and fidelity.step_calibration (one parser)
    ("validate-repeats-zero", "fidelity.validate", ["--repeats", "0", "--out", OUT], "--repeats"),
    ("validate-sigma-nan", "fidelity.validate", ["--sigma", "nan", "--out", OUT], "--sigma"),
    ("validate-num-requests-negative", "fidelity.validate", ["--num-requests", "-5", "--out", OUT], "--num-requests"),
    ("validate-median-above-max", "fidelity.validate", ["--prompt-median", "600", "--out", OUT], "--prompt-median"),
    ("validate-loads", "fidelity.validate", ["--loads", "0.5,2", "--out", OUT], "--loads"),
    ("validate-reference-zero", "fidelity.validate", ["--reference-every-s", "0", "--out", OUT],
     "--reference-every-s"),
    ("validate-unknown-model", "fidelity.validate", ["--model", "gpt-9", "--out", OUT], "gpt-9"),
    ("validate-unknown-hardware", "fidelity.validate", ["--hardware", "tpu-v5", "--out", OUT], "tpu-v5"),
    ("validate-out-file", "fidelity.validate", ["--out", "{tmp}/afile"], "--out"),
    ("validate-unknown-policy", "fidelity.validate", ["--policies", "fifo", "--out", OUT], "--policies"),
    ("step-calibration-out-file", "fidelity.step_calibration", [*TINY, *CPU, "--out", "{tmp}/afile"], "--out"),
    ("step-calibration-unknown-model", "fidelity.step_calibration", ["--model", "gpt-9", *CPU, "--out", OUT],
     "gpt-9"),
    ("step-calibration-threads-zero", "fidelity.step_calibration", [*TINY, *CPU, "--out", OUT, "--threads", "0"],
     "--threads"),
    # workloads.fit
    ("workloads-fit-num-requests-negative", "workloads.fit", ["{tmp}/trace.csv", "--format", "csv",
                                                              "--num-requests", "-5"], "--num-requests"),
    ("workloads-fit-start-nan", "workloads.fit", ["{tmp}/trace.csv", "--format", "csv", "--start-s", "nan"],
     "--start-s"),
    ("workloads-fit-window-reversed", "workloads.fit", ["{tmp}/trace.csv", "--format", "csv", "--start-s", "5",
                                                        "--end-s", "1"], "--end-s"),
    ("workloads-fit-unknown-format", "workloads.fit", ["{tmp}/trace.csv", "--format", "parquet"], "--format"),
    ("workloads-fit-missing-trace", "workloads.fit", ["{tmp}/nope.csv", "--format", "csv"], "nope.csv"),
    # a pipe where a file belongs would block the read forever
    ("workloads-fit-pipe", "workloads.fit", ["{tmp}/pipe.csv", "--format", "csv"], "not a regular file"),
    ("fit-engine-run-pipe", "fidelity.fit_engine", ["{tmp}/pipe.csv", "--out", "{tmp}/out/p.json"],
     "not a regular file"),
    ("capture-model-pipe", "calibration.capture", ["--model", "{tmp}/pipe.json", *CPU, "--out", OUT],
     "not a regular file"),
    # benchmarks: arguments checked, unknown ones refused, before anything runs
    ("aic-tables-bogus", "benchmarks.aic_tables", ["--bogus"], "--bogus"),
    ("memory-zero", "benchmarks.memory", ["0"], "sizes"),
    ("memory-unknown-policy", "benchmarks.memory", ["1000", "--policy", "fifo"], "--policy"),
    ("replicas-requests-zero", "benchmarks.replicas", ["--num-requests", "0"], "--num-requests"),
    ("replicas-bogus", "benchmarks.replicas", ["--bogus"], "--bogus"),
    ("day-hours-zero", "benchmarks.autoscaling_day", ["--hours", "0"], "--hours"),
    ("day-repeats-bogus", "benchmarks.autoscaling_day", ["--repeats", "x"], "--repeats"),
    ("day-mean-negative", "benchmarks.autoscaling_day", ["--mean-rps", "-3"], "--mean-rps"),
    ("end-memory-zero-requests", "benchmarks.end_of_run_memory", ["--requests", "0"], "--requests"),
    ("end-memory-gaps-bogus", "benchmarks.end_of_run_memory", ["--gaps", "x"], "--gaps"),
    ("speed-requests-zero", "benchmarks.speed", ["--requests", "0"], "--requests"),
    ("speed-repeats-negative", "benchmarks.speed", ["--repeats", "-2"], "--repeats"),
    ("speed-unknown-section", "benchmarks.speed", ["--sections", "5"], "--sections"),
    ("speed-empty-sections", "benchmarks.speed", ["--sections", ""], "--sections"),
    ("scheduler-equivalence-zero", "benchmarks.scheduler_equivalence", ["--num-workloads", "0"], "--num-workloads"),
    ("scheduler-equivalence-out-folder", "benchmarks.scheduler_equivalence", ["--out", "{tmp}"], "--out"),
    ("vllm-fidelity-unknown-model", "benchmarks.vllm_fidelity", ["--models", "tiny,huge", "--out", OUT], "huge"),
    ("vllm-fidelity-repeats-zero", "benchmarks.vllm_fidelity", ["--repeats", "0", "--out", OUT], "--repeats"),
    ("fidelity-bench-repeats", "benchmarks.fidelity", ["--repeats", "2", "--out", OUT], "--repeats"),
    ("fidelity-bench-check-only-empty", "benchmarks.fidelity", ["--check-only", "--out", "{tmp}/empty"],
     "--check-only"),
    ("frontend-repeats-zero", "benchmarks.frontend_latency", ["--out", OUT, "--repeats", "0"], "--repeats"),
    ("frontend-vocab-small", "benchmarks.frontend_latency", ["--out", OUT, "--vocab", "100"], "--vocab"),
    ("frontend-lengths-word", "benchmarks.frontend_latency", ["--out", OUT, "--lengths", "100,many"], "--lengths"),
    ("frontend-out-is-file", "benchmarks.frontend_latency", ["--out", "{tmp}/afile"], "--out"),
    ("frontend-load-streams-word", "benchmarks.frontend_load", ["--out", OUT, "--streams", "50,lots"], "--streams"),
    ("frontend-load-streams-zero", "benchmarks.frontend_load", ["--out", OUT, "--streams", "0"], "--streams"),
    ("frontend-load-one-output", "benchmarks.frontend_load", ["--out", OUT, "--outputs", "8"], "--outputs"),
    ("frontend-load-repeats-zero", "benchmarks.frontend_load", ["--out", OUT, "--repeats", "0"], "--repeats"),
    ("gpu-fidelity-unknown-model", "benchmarks.gpu_fidelity", ["--models", "roofline,magic", "--out", OUT],
     "--models"),
    ("gpu-fidelity-unknown-set", "benchmarks.gpu_fidelity", ["--sets", "a100", "--out", OUT], "--sets"),
    ("gpu-fidelity-stage-s-zero", "benchmarks.gpu_fidelity", ["--max-stage-s", "0", "--out", OUT], "--max-stage-s"),
    ("gpu-fidelity-out-loop", "benchmarks.gpu_fidelity", ["--out", "{tmp}/loop"], "loop"),
    ("gpu-fidelity-missing-stages", "benchmarks.gpu_fidelity", ["--stages", "{tmp}/nothing.csv", "--out", OUT],
     "nothing.csv"),
    ("gpu-cross-fit-out-loop", "benchmarks.gpu_cross_fit", ["--out", "{tmp}/loop"], "loop"),
    ("public-gpu-unknown-model", "benchmarks.public_gpu_checks", ["--models", "roofline,magic", "--out", OUT],
     "--models"),
    ("public-gpu-unknown-point", "benchmarks.public_gpu_checks", ["--points", "a100-q14-2k,b300", "--out", OUT],
     "'b300'"),
    ("public-gpu-out-loop", "benchmarks.public_gpu_checks", ["--out", "{tmp}/loop"], "loop"),
    # benchmarks.real_run_checks: the outputs' folder, the file it writes, outputs older than it
    ("real-run-checks-no-folder", "benchmarks.real_run_checks", ["--gpu-dir", "{tmp}/nothing", "--out", OUT],
     "--gpu-dir"),
    ("real-run-checks-out-folder", "benchmarks.real_run_checks", ["--out", "{tmp}"], "is a folder"),
    ("real-run-checks-out-loop", "benchmarks.real_run_checks", ["--out", "{tmp}/loop/c.json"], "loop"),
    ("gpu-cross-fit-bogus", "benchmarks.gpu_cross_fit", ["--bogus"], "--bogus"),
    ("gpu-cross-fit-shared-empty", "benchmarks.gpu_cross_fit", ["--shared", "{tmp}/empty", "--out", OUT], "--shared"),
    ("gpu-fidelity-shared-empty", "benchmarks.gpu_fidelity", ["--shared", "{tmp}/empty", "--out", OUT], "--shared"),
    ("fit-engine-unknown-fit", "fidelity.fit_engine", ["{tmp}/nothing", "--out", OUT, "--fit", "magic"], "--fit"),
    ("kernel-efficiency-shared-empty", "benchmarks.kernel_efficiency", ["--shared", "{tmp}/empty"], "--shared"),
    ("kernel-efficiency-bogus", "benchmarks.kernel_efficiency", ["--bogus"], "--bogus"),
    ("pcie-collectives-bogus", "benchmarks.pcie_collectives", ["--bogus"], "--bogus"),
    ("import-lss-missing-folder", "calibration.import_llmservingsim", ["{tmp}/nothing", "--out", OUT], "nothing"),
    ("import-lss-tp-zero", "calibration.import_llmservingsim", ["{tmp}/empty", "--out", OUT, "--tp", "0"], "--tp"),
    ("import-lss-out-is-file", "calibration.import_llmservingsim", ["{tmp}/empty", "--out", "{tmp}/afile"], "--out"),
    ("import-lss-no-meta", "calibration.import_llmservingsim", ["{tmp}/empty", "--out", OUT], "empty/meta.yaml"),
    ("import-lss-meta-bad-yaml", "calibration.import_llmservingsim", ["{tmp}/lss_badmeta", "--out", OUT], "meta.yaml"),
    ("import-lss-meta-no-model", "calibration.import_llmservingsim", ["{tmp}/lss_nomodel", "--out", OUT], "--model"),
]

POINT = {"model": "tiny", "hardware": "h100-sxm", "dtype": "fp32",
         "engine": {"policy": "chunked_prefill", "max_num_seqs": 8, "max_num_batched_tokens": 256,
                    "num_gpu_blocks": 64, "block_size": 32},
         "workload": {"num_requests": 4, "arrival": {"process": "poisson", "rate_per_s": 2},
                      "prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 4}}}
BENCH = {"ttfts": [0.1, 0.2, 0.0], "itls": [[0.01, 0.01], [0.02], []], "input_lens": [5, 6, 7],
         "output_lens": [3, 2, 4], "start_times": [100.0, 100.5, 101.0], "errors": ["", "", ""]}


@pytest.fixture
def files(tmp_path: Path) -> Path:
    import yaml
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "empty").mkdir()
    for pipe in ("pipe.csv", "pipe.json"):
        os.mkfifo(tmp_path / pipe)
    (tmp_path / "qstr").mkdir()
    (tmp_path / "qstr" / "config.json").write_text(json.dumps(
        {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 512,
         "vocab_size": 1000, "quantization_config": "awq"}))
    for name, text in (("lss_badmeta", "model: [\n"), ("lss_nomodel", "hardware: RTX4090\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.yaml").write_text(text)
    (tmp_path / "point.yaml").write_text(yaml.safe_dump(POINT))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({**POINT, "cluster": {"num_replicas": 2}}))
    (tmp_path / "ok.json").write_text(json.dumps({**BENCH, "errors": ["", "", "timeout"]}))
    (tmp_path / "bad_trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,16,4\n0.5,lots,4\n")
    from calibration import measurements
    row = {"family": "gemm", "op": "", "m": 4, "n": 64, "k": 64, "latency_s": 1e-5, "status": "ok"}
    meta = {"model": "tiny", "gpu": "cpu", "tp": 1, "dtype": "fp32"}
    for name, bad in (("meas_word", {"latency_s": "fast"}), ("meas_neg", {"m": -5}), ("meas_meta", {})):
        measurements.write(tmp_path / name, [{**row, **bad}, row], meta)
    (tmp_path / "meas_meta" / "meta.json").write_text("[1]")
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" +
                                        "".join(f"{0.3 * i + 0.01 * i * i},{16 + i},{4 + i % 3}\n" for i in range(8)))
    return tmp_path


def _subst(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv]


def call_main(module: str, argv: list[str]) -> int:
    try:
        return importlib.import_module(module).main(argv)
    except SystemExit as e:   # argparse's own exit
        return e.code


@pytest.mark.parametrize("module, argv, expected", [pytest.param(m, a, e, id=i) for i, m, a, e in CASES])
def test_bad_input_is_one_line_naming_it(module, argv, expected, files, capsys):
    rc = call_main(module, _subst(argv, files))
    out, err = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stderr: {err!r}"
    assert err.count("\n") == 1 and err.startswith("error: "), f"not one error line: {err!r}"
    assert expected in err, f"{expected!r} not named in {err!r}"
    assert "Traceback" not in err and not out
    assert not (files / "out").exists(), "a refused command wrote its output"


def test_every_command_is_covered():
    modules = {m for _, m, _, _ in CASES}
    commands = {"calibration.capture", "calibration.fit", "calibration.import_aic", "calibration.compare",
                "calibration.import_llmservingsim",
                "fidelity.fit_engine", "fidelity.compare", "fidelity.vllm_run", "fidelity.validate",
                "fidelity.step_calibration", "workloads.fit"}
    benchmarks = {f"benchmarks.{p.stem}" for p in (ROOT / "benchmarks").glob("*.py")
                  if "\ndef main(" in p.read_text()}   # the commands, not the helpers they share
    assert commands | benchmarks <= modules
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("module", sorted({m for _, m, _, _ in CASES}))
def test_help_exits_0_without_side_effects(module, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a command that wrote its default output folder would leave it here
    assert call_main(module, ["--help"]) == 0
    assert "usage:" in capsys.readouterr().out and not list(tmp_path.iterdir())


# ---- valid borderline inputs run ----
def test_workloads_fit_more_requests_than_the_trace_has(files, capsys):
    assert call_main("workloads.fit", _subst(["{tmp}/trace.csv", "--format", "csv", "--num-requests", "1000"],
                                            files)) == 0
    assert "num_requests: 8" in capsys.readouterr().out


def test_compare_with_a_failed_request_states_it(files, capsys):
    argv = _subst([RUN, "--config", "{tmp}/point.yaml", "--out", OUT], files)
    assert call_main("fidelity.compare", argv) == 0
    text = (files / "out" / "compare.md").read_text()
    assert "1 of 3 real requests failed" in text and "1 of 3 real requests failed" in capsys.readouterr().out


def test_two_roofline_priors_compare(capsys):
    assert call_main("calibration.compare", ["roofline", "roofline", "--model", "tiny", "--gpu", "h100-sxm"]) == 0
    assert "B/A" in capsys.readouterr().out


def test_output_folder_that_exists_empty_is_used(files):
    from commandline.outputs import out_dir, out_file
    assert out_dir(files / "empty") == files / "empty"
    assert out_file(files / "new" / "p.json") == files / "new" / "p.json"
    assert not (files / "new").exists()   # checked, not created: the command creates it when it writes


def test_tp_that_shards_the_model_is_accepted():
    import dataclasses
    from costmodels.modelargs import tp_problem
    from costmodels.catalog import get_model
    llama = get_model("llama-3-8b")   # 32 heads, 8 KV heads, MLP 14336
    assert tp_problem(llama, 8) is None and tp_problem(llama, 16) is None   # 16: KV heads replicated
    assert tp_problem(get_model("tiny"), 4) is None                        # 4 heads, 2 KV heads
    assert "attention heads" in tp_problem(llama, 3)
    assert "KV heads" in tp_problem(dataclasses.replace(llama, num_heads=12, num_kv_heads=4), 6)


# ---- Ctrl-C keeps what finished ----
def test_capture_interrupted_keeps_the_points_it_timed(monkeypatch):
    torch = pytest.importorskip("torch")
    from calibration import capture
    from costmodels.catalog import get_model
    calls = []

    def fake_point(b, model, tp, row, timer, repeats, probe, point_passes):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(row)
        row["flops"] = row["bytes"] = 1.0
        point_passes.append(([1e-3], 1, 1.0))

    monkeypatch.setattr(capture, "_time_point", fake_point)
    stopped = {}
    rows = capture.capture(get_model("tiny"), 1, "fp32", torch.device("cpu"), "small", progress=False, repeats=1,
                           stopped=stopped)
    assert stopped == {"interrupted": True}
    measured = [r for r in rows if r["status"] == "ok"]
    assert len(measured) == 3 and all(r["latency_s"] == 1e-3 for r in measured)
    assert all(r["status"] == capture.NOT_MEASURED for r in rows if r["status"] != "ok")


def test_capture_main_writes_what_finished_and_exits_130(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from calibration import capture, measurements
    ok = {"family": "gemm", "op": "", "m": 1, "n": 8, "k": 8, "status": "ok", "latency_s": 1e-3, "flops": 1.0,
          "bytes": 1.0}
    def interrupted(*a, stopped, **k):
        stopped["interrupted"] = True
        return [ok, {**ok, "m": 2, "status": capture.NOT_MEASURED}]
    monkeypatch.setattr(capture, "capture", interrupted)
    assert capture.main([*TINY, *CPU, "--out", str(tmp_path / "c"), "--quiet"]) == 130
    frame, meta = measurements.read(tmp_path / "c")
    assert len(frame) == 1 and meta["interrupted"] is True and not (tmp_path / "c" / "profile.json").exists()
    assert "interrupted: 1 points measured" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_capture_ctrl_c_exits_130_within_a_second_keeping_the_points_timed(tmp_path):
    pytest.importorskip("torch")
    from calibration import capture, measurements
    out = tmp_path / "cap"
    p = subprocess.Popen([sys.executable, "-m", "calibration.capture", *TINY, *CPU, "--out", str(out)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    seen = b""
    while b"calibrating" not in seen:   # the progress bar: kernels are being timed
        chunk = os.read(p.stderr.fileno(), 256)
        assert chunk, f"capture ended before timing anything (exit {p.wait()})"
        seen += chunk
    time.sleep(0.5)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    rc = p.wait(timeout=30)
    took = time.monotonic() - t0
    err = p.stderr.read().decode()
    assert rc == 130 and "interrupted:" in err and "Traceback" not in err, err
    assert took < 1.0, f"exit took {took:.2f} s"
    frame, meta = measurements.read(out)   # the timed points, in the format calibration.fit reads
    assert meta["interrupted"] is True and len(frame) >= 1
    assert capture.NOT_MEASURED in (out / "measurements.csv").read_text()
    assert not (out / "profile.json").exists()


def test_guarded_turns_ctrl_c_into_130_and_one_line(capsys):
    from commandline.exits import guarded

    def main(argv):
        raise KeyboardInterrupt
    assert guarded(main, [], kept="3 runs kept") == 130
    assert capsys.readouterr().err.strip() == "interrupted: 3 runs kept"


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_benchmark_ctrl_c_exits_130_within_a_second(tmp_path):
    """A benchmark measuring in a child process: Ctrl-C (to the terminal's whole process group) ends both."""
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.memory", "2000000"], cwd=ROOT, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()   # the header: the child run has started
    time.sleep(1.0)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    rc = p.wait(timeout=30)
    took = time.monotonic() - t0
    err = p.stderr.read()
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    assert took < 1.0, f"exit took {took:.2f} s"


def test_cli_reader_gone_is_not_an_error(files):
    """`python -m workloads.fit TRACE | head -1`: the reader stops early; no error line, exit 0."""
    p = subprocess.Popen([sys.executable, "-m", "workloads.fit", str(files / "trace.csv"), "--format", "csv"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()   # the reader is gone before anything is printed
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == ""


def test_cli_subprocess_one_line(files):
    p = subprocess.run([sys.executable, "-m", "benchmarks.speed", "--sections", "5"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--sections" in p.stderr and not p.stdout


# ---- real-run files: the reader names the file, the field and the row ----
CSV_HEAD = "arrival_s,prompt_tokens,output_tokens,first_token_s,finish_s\n"
RUN_CASES = [
    ("ttfts-a-number", "r.json", {**BENCH, "ttfts": 0.1}, "ttfts: expected a list"),
    ("itls-an-object", "r.json", {**BENCH, "itls": {"a": 1}}, "itls: expected a list"),
    ("itl-a-number", "r.json", {**BENCH, "itls": [5, [0.02], []]}, "request 0: itls"),
    ("start-iso-dates", "r.json", {**BENCH, "start_times": ["2024-01-01T00:00:00"] * 3}, "request 0: start_times"),
    ("start-epoch-ms", "r.json", {**BENCH, "start_times": [1.7e12, 1.7e12 + 500, 1.7e12 + 1000]}, "milliseconds"),
    ("ttft-negative", "r.json", {**BENCH, "ttfts": [0.1, -0.2, 0.1]}, "request 1: ttfts"),
    ("tokens-fractional", "r.json", {**BENCH, "output_lens": [3, 2.5, 4]}, "request 1: output tokens"),
    ("tokens-negative", "r.json", {**BENCH, "input_lens": [5, -6, 7]}, "request 1: prompt tokens"),
    ("tokens-1e12", "r.json", {**BENCH, "output_lens": [3, 1e12, 4]}, "request 1: output tokens"),
    ("tokens-booleans", "r.json", {**BENCH, "input_lens": [True, 6, 7]}, "request 0: input_lens"),
    ("itl-negative", "r.json", {**BENCH, "itls": [[0.01, -0.5], [0.02], [0.1]]}, "request 0 gap 1"),
    ("lengths-differ", "r.json", {**BENCH, "input_lens": [5, 6]}, "different lengths"),
    ("errors-a-number", "r.json", {**BENCH, "errors": 3}, "errors"),
    ("guidellm-list-benchmark", "g.json", {"benchmarks": [[1, 2]]}, "benchmarks[0]"),
    ("guidellm-requests-number", "g.json", {"benchmarks": [{"requests": {"successful": 5}}]}, "successful"),
    ("guidellm-iso-start", "g.json", {"benchmarks": [{"requests": {"successful": [
        {"request_start_time": "2024-01-01", "first_token_time": 1, "last_token_time": 2, "prompt_tokens": 3,
         "output_tokens": 3}]}}]}, "benchmark 0 request 0: request_start"),
    ("csv-iso-dates", "r.csv", CSV_HEAD + "2024-01-01T00:00:00,5,3,1,2\n", "line 2: arrival_s"),
    ("csv-word-in-tokens", "r.csv", CSV_HEAD + "0,5,3,1,2\n1,lots,3,1.5,2\n", "line 3: prompt_tokens"),
    ("csv-first-before-send", "r.csv", CSV_HEAD + "0,5,3,1,2\n1,5,3,0.5,2\n", "line 3: first token before"),
    ("csv-last-before-first", "r.csv", CSV_HEAD + "0,5,3,1,0.5\n", "line 2: last token before the first"),
    ("csv-negative-ttft", "r.csv", "arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n0,5,3,-0.1,0.2\n",
     "line 2: first token before"),
    ("csv-token-times-unordered", "r.csv", "arrival_s,prompt_tokens,output_tokens,token_times_s\n0,5,3,0.1 0.3 0.2\n",
     "line 2 token 2"),
    ("csv-token-times-word", "r.csv", "arrival_s,prompt_tokens,output_tokens,token_times_s\n0,5,3,0.1 soon\n",
     "line 2: token_times_s"),
]


@pytest.mark.parametrize("name, content, expected", [pytest.param(n, c, e, id=i) for i, n, c, e in RUN_CASES])
def test_bad_run_file_names_file_field_and_row(name, content, expected, tmp_path, capsys):
    f = tmp_path / name
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    rc = call_main("fidelity.fit_engine", [str(f), "--out", str(tmp_path / "out" / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and str(f) in err and expected in err, err
    assert "Traceback" not in err and not (tmp_path / "out" / "p.json").exists()


def test_broken_iterations_json_names_the_row(tmp_path, capsys):
    from tests.fake_runs import TINY_POINT, make_run
    d = make_run(tmp_path, "p", json.loads(json.dumps({**TINY_POINT, "workload": {**TINY_POINT["workload"],
                                                                                   "num_requests": 6}})))
    it = (d / "iterations.csv").read_text().splitlines()
    header = it[0].split(",")
    cells = it[3].split(",")
    cells[header.index("decode_json")] = "not-json"
    (d / "iterations.csv").write_text("\n".join([*it[:3], ",".join(cells), *it[4:]]) + "\n")
    assert call_main("fidelity.compare", [str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "iterations.csv: row 2: decode_json" in err


def test_a_few_failed_requests_are_counted_not_refused(tmp_path):
    from fidelity.realruns import read_runs
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**BENCH, "errors": ["", "timeout", ""], "ttfts": [0.1, 0.0, 0.1]}))
    (run,) = read_runs(f)
    assert (run.requests["status"] != "finished").sum() == 1 and len(run.requests) == 3


# ---- model configs: quantisation priced or refused, never silently bf16 ----
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
            "max_position_embeddings": 8192}


@pytest.mark.parametrize("quant, expected", [
    ("awq", "quantization_config: expected an object"),
    ([4], "quantization_config: expected an object"),
    ({"quant_method": 4}, "quant_method"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes' is not modelled"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32}, "group_size"),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, "MIXED_PRECISION"),
])
def test_unpriced_quantisation_is_one_line(quant, expected, tmp_path):
    from costmodels.catalog import CatalogError, get_model
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA_8B, "quantization_config": quant}))
    with pytest.raises(CatalogError, match=expected) as e:
        get_model(str(f))
    assert str(f) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("quant", [{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
                                   {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}])
def test_awq_and_gptq_are_priced_as_int4_weights_with_bf16_compute(quant, tmp_path):
    from costmodels import RooflineCostModel
    from costmodels.catalog import get_gpu, get_model
    from costmodels.deployment import Deployment, weight_bytes_per_gpu
    (tmp_path / "q").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps({**LLAMA_8B, "quantization_config": quant}))
    (tmp_path / "b" / "config.json").write_text(json.dumps(LLAMA_8B))
    q, b = get_model(str(tmp_path / "q")), get_model(str(tmp_path / "b"))
    assert q.quantization == "int4" and b.quantization is None
    p = b.param_counts()
    linear = p["attention"] + p["dense_mlp"]
    # 4-bit weights + an fp16 scale and a 4-bit zero per 128 in the decoder; 16-bit embeddings and LM head
    saved = weight_bytes_per_gpu(b, Deployment()) - weight_bytes_per_gpu(q, Deployment())
    assert saved == pytest.approx(linear * (2.0 - 0.5 - 2.5 / 128))
    gpu = get_gpu("h100-sxm")
    rq, rb = RooflineCostModel(q, gpu), RooflineCostModel(b, gpu)
    assert rq.step_time_s(decode=[1024]) < 0.5 * rb.step_time_s(decode=[1024])   # weight reads dominate decode
    assert rq.step_time_s(prefill=[(8192, 0)]) == pytest.approx(rb.step_time_s(prefill=[(8192, 0)]), rel=0.02)


def test_kernel_profile_refuses_int4_weights(tmp_path):
    from costmodels.catalog import CatalogError, get_gpu, get_model
    from costmodels.selection import load_cost_model
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": 4,
                                                                 "group_size": 128}}))
    with pytest.raises(CatalogError, match="int4"):
        load_cost_model("llama-3-8b__h100-sxm__tp1__bf16", get_model(str(f)), get_gpu("h100-sxm"))
