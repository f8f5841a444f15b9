"""Every bad input to `python -m experiments.run` is one line naming the key or file, exit 2, no traceback.

Table-driven: each case patches a small valid sweep (dotted keys), or gives the sweep file's text, or adds
command-line arguments; `{tmp}` in a value is the test's folder, where `bad_files` wrote the bad model
configs and traces. The run goes through `main()` in-process (the same code path as the command line,
without a Python start-up per case); `test_cli_subprocess_one_line` checks the real command once.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.run import main

BASE = {"name": "bad", "model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"policy": "chunked_prefill"},
        "workload": {"num_requests": 4, "arrival": {"process": "poisson", "rate_per_s": 2},
                     "prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 4}}}
DELETE = object()
NAN, INF = math.nan, math.inf
CLOSED = {"process": "closed", "concurrency": 2}
SEARCH = {"over": "workload.arrival.rate_per_s", "slo": {"ttft_p99_ms": 200}, "range": [1, 8]}
TRACE = {"path": "{tmp}/trace.csv", "format": "csv"}

# (id, patch of dotted keys | sweep file text | ("argv", extra arguments), what the error line must name)
CASES = [
    # the YAML itself
    ("duplicate-top-key", "name: a\nname: b\n", "duplicate key 'name'"),
    ("duplicate-nested-key", "workload:\n  arrival:\n    rate_per_s: 1\n    rate_per_s: 2\n", "duplicate key 'rate_per_s'"),
    ("duplicate-flow-key", "engine: {policy: tgi, policy: static}\n", "duplicate key 'policy'"),
    ("invalid-yaml", "engine: {policy: [\n", "invalid YAML"),
    ("top-level-list", "- a\n- b\n", "expected a YAML mapping"),
    ("empty-file", "", "expected a YAML mapping"),
    ("numeric-top-key", "1: x\n", "a key must be a string"),
    ("yaml-on-as-key", {"engine": {True: 1}}, "engine.True"),
    ("numeric-grid-key", {"grid": {1: [2]}}, "grid.1"),
    # arrivals
    ("rate-nan-tgi", {"workload.arrival.rate_per_s": NAN, "engine.policy": "tgi"}, "workload.arrival.rate_per_s"),
    ("rate-nan-chunked", {"workload.arrival.rate_per_s": NAN}, "workload.arrival.rate_per_s"),
    ("rate-zero", {"workload.arrival.rate_per_s": 0}, "workload.arrival.rate_per_s"),
    ("rate-negative", {"workload.arrival.rate_per_s": -1}, "workload.arrival.rate_per_s"),
    ("rate-string", {"workload.arrival.rate_per_s": "fast"}, "workload.arrival.rate_per_s"),
    ("rate-missing", {"workload.arrival.rate_per_s": DELETE}, "workload.arrival.rate_per_s"),
    ("cv-nan", {"workload.arrival": {"process": "gamma", "rate_per_s": 2, "cv": NAN}}, "workload.arrival.cv"),
    ("cv-inf", {"workload.arrival": {"process": "gamma", "rate_per_s": 2, "cv": INF}}, "workload.arrival.cv"),
    ("think-time-nan", {"workload.arrival": {**CLOSED, "think_time_s": NAN}}, "workload.arrival.think_time_s"),
    ("concurrency-inf", {"workload.arrival": {**CLOSED, "concurrency": INF}}, "workload.arrival.concurrency"),
    ("concurrency-fraction", {"workload.arrival": {**CLOSED, "concurrency": 2.5}}, "workload.arrival.concurrency"),
    ("concurrency-zero", {"workload.arrival": {**CLOSED, "concurrency": 0}}, "workload.arrival.concurrency"),
    ("unknown-process", {"workload.arrival.process": "uniform"}, "workload.arrival.process"),
    ("constant-with-cv", {"workload.arrival": {"process": "constant", "rate_per_s": 2, "cv": 2}}, "workload.arrival.cv"),
    ("arrival-not-mapping", {"workload.arrival": "poisson"}, "workload.arrival"),
    # request counts and lengths
    ("num-requests-huge", {"workload.num_requests": 1_000_000_000_000}, "workload.num_requests"),
    ("num-requests-zero", {"workload.num_requests": 0}, "workload.num_requests"),
    ("num-requests-fraction", {"workload.num_requests": 1.5}, "workload.num_requests"),
    ("num-requests-bool", {"workload.num_requests": True}, "workload.num_requests"),
    ("lognormal-max-below-median", {"workload.prompt_tokens": {"dist": "lognormal", "median": 512, "sigma": 1,
                                                               "max": 100}}, "workload.prompt_tokens.max"),
    ("lognormal-sigma-nan", {"workload.prompt_tokens": {"dist": "lognormal", "median": 512, "sigma": NAN}},
     "workload.prompt_tokens.sigma"),
    ("unknown-dist", {"workload.prompt_tokens.dist": "zipf"}, "workload.prompt_tokens.dist"),
    ("uniform-min-above-max", {"workload.output_tokens": {"dist": "uniform", "min": 9, "max": 3}},
     "workload.output_tokens"),
    ("output-missing", {"workload.output_tokens": DELETE}, "workload.output_tokens"),
    ("long-prompts-unknown", {"workload.long_prompts": "truncate"}, "workload.long_prompts"),
    ("unknown-workload-key", {"workload.foo": 1}, "workload.foo"),
    ("priority-negative-weight", {"workload.priority": {"classes": [0, 1], "weights": [1, -1]}},
     "workload.priority.weights"),
    # engine
    ("unknown-engine-key", {"engine.foo": 1}, "engine.foo"),
    ("unknown-policy", {"engine.policy": "fifo"}, "engine.policy"),
    ("block-size-zero", {"engine.block_size": 0}, "engine.block_size"),
    ("gpu-util-above-one", {"engine.gpu_memory_utilization": 1.5}, "engine.gpu_memory_utilization"),
    ("gpu-util-inf", {"engine.gpu_memory_utilization": INF}, "engine.gpu_memory_utilization"),
    ("max-num-seqs-negative", {"engine.max_num_seqs": -3}, "engine.max_num_seqs"),
    ("max-num-seqs-string", {"engine.max_num_seqs": "many"}, "engine.max_num_seqs"),
    ("full-isl-not-a-boolean", {"engine.scheduler_reserve_full_isl": "no"}, "engine.scheduler_reserve_full_isl"),
    ("vllm-version-unquoted", {"engine.vllm_version": 0.19}, "engine.vllm_version"),
    ("vllm-version-unmodelled", {"engine.vllm_version": "0.8.5"}, "engine.vllm_version"),
    ("adaptive-threshold-before-its-release", {"engine.long_prefill_token_threshold_adaptive": True,
                                               "engine.vllm_version": "0.30.0"},
     "engine.long_prefill_token_threshold_adaptive"),
    ("fast-path-word", {"engine.fast_path": "maybe"}, "engine.fast_path"),
    ("preemption-mode", {"engine.preemption_mode": "evict"}, "engine.preemption_mode"),
    ("max-model-len-one", {"engine.max_model_len": 1}, "engine.max_model_len"),
    ("num-gpu-blocks-zero", {"engine.num_gpu_blocks": 0}, "engine.num_gpu_blocks"),
    ("frontend-unknown-key", {"engine.frontend": {"fixed_s": 0.002}}, "engine.frontend.fixed_s"),
    ("frontend-negative", {"engine.frontend": {"fixed_ms": -1}}, "engine.frontend.fixed_ms"),
    ("frontend-per-token-nan", {"engine.frontend": {"per_1k_prompt_tokens_ms": NAN}},
     "engine.frontend.per_1k_prompt_tokens_ms"),
    ("frontend-per-token-string", {"engine.frontend": {"per_1k_prompt_tokens_ms": "2ms"}},
     "engine.frontend.per_1k_prompt_tokens_ms"),
    ("frontend-unknown-kind", {"engine.frontend": {"kind": "grpc"}}, "engine.frontend.kind"),
    ("frontend-unknown-kind-word", {"engine.frontend": "grpc"}, "engine.frontend.kind"),
    ("frontend-not-mapping", {"engine.frontend": 3}, "engine.frontend"),
    ("check-invariants-string", {"engine.check_invariants": "yes please"}, "engine.check_invariants"),
    ("prefix-caching-static", {"engine.policy": "static", "engine.enable_prefix_caching": True},
     "engine.enable_prefix_caching"),
    ("continuous-budget-below-max-len", {"engine.policy": "continuous", "engine.max_num_batched_tokens": 1024},
     "engine.max_num_batched_tokens"),
    ("weights-do-not-fit", {"engine.gpu_memory_utilization": 0.05}, "engine"),
    ("engine-not-mapping", {"engine": ["chunked_prefill"]}, "engine"),
    ("knob-of-another-policy", {"engine.policy": "static", "engine.max_num_batched_tokens": 512},
     "engine.max_num_batched_tokens: not a knob of policy static"),
    ("knob-of-another-policy-in-grid", {"engine.max_num_seqs": 8, "grid": {"engine.policy": ["static", "tgi"]}},
     "engine.max_num_seqs: not a knob of policy tgi"),
    ("policy-section-unknown-knob", {"engine.trtllm": {"max_num_seqs": 8}}, "engine.trtllm.max_num_seqs"),
    ("policy-section-not-mapping", {"engine.sglang": 8192}, "engine.sglang"),
    ("policy-section-bad-type", {"engine.tgi": {"prefill_chunking": "yes"}}, "engine.tgi.prefill_chunking"),
    ("knob-given-twice", {"engine.max_num_seqs": 8, "engine.chunked_prefill": {"max_num_seqs": 16}},
     "engine.max_num_seqs"),
    ("budget-below-max-num-seqs", {"engine.max_num_seqs": 64, "engine.max_num_batched_tokens": 32},
     "engine.max_num_batched_tokens"),
    # model and hardware
    ("unknown-hardware", {"hardware": "tpu-v5"}, "hardware"),
    ("hardware-number", {"hardware": 5}, "hardware"),
    ("unknown-model", {"model": "gpt-5"}, "model"),
    ("config-json-list", {"model": "{tmp}/list/config.json"}, "list/config.json"),
    ("config-json-strings", {"model": "{tmp}/strings/config.json"}, "num_attention_heads"),
    ("config-json-zero-heads", {"model": "{tmp}/zero/config.json"}, "num_attention_heads"),
    ("config-json-missing-key", {"model": "{tmp}/missing/config.json"}, "hidden_size"),
    ("config-json-invalid", {"model": "{tmp}/invalid/config.json"}, "invalid/config.json"),
    ("config-json-kv-heads", {"model": "{tmp}/kv/config.json"}, "num_key_value_heads"),
    ("config-json-absent", {"model": "{tmp}/absent/config.json"}, "absent/config.json"),
    ("tp-does-not-divide", {"tensor_parallel_size": 3}, "tensor_parallel_size"),
    ("tp-zero", {"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ("dtype", {"dtype": "int4"}, "dtype"),
    ("profile-number", {"profile": 5}, "profile"),
    # top level, grid, seeds
    ("unknown-top-key", {"foo": 1}, "foo"),
    ("seeds-string", {"seeds": "zero"}, "seeds"),
    ("grid-not-mapping", {"grid": [1, 2]}, "grid"),
    ("grid-empty-list", {"grid": {"engine.policy": []}}, "grid.engine.policy"),
    ("grid-seeds", {"grid": {"seeds": [[0], [1]]}}, "grid.seeds"),
    ("grid-unknown-section", {"grid": {"bogus.x": [1]}}, "grid.bogus.x"),
    ("grid-nan-value", {"grid": {"workload.arrival.rate_per_s": [1, NAN]}}, "grid.workload.arrival.rate_per_s[1]"),
    ("grid-bad-value", {"grid": {"engine.block_size": [16, 0]}}, "engine.block_size"),
    ("grid-too-many-points", {"grid": {"engine.block_size": list(range(1, 101)), "engine.max_num_seqs":
                                       list(range(1, 101)), "workload.arrival.rate_per_s": list(range(1, 12))}},
     "grid: 110,000 points"),
    ("seeds-repeated", {"seeds": [0, 1, 0]}, "seeds"),
    # cluster, disaggregation, slo, search, capacity
    ("cluster-zero-replicas", {"cluster": {"num_replicas": 0}}, "cluster.num_replicas"),
    ("cluster-unknown-router", {"cluster": {"num_replicas": 2, "router": "random"}}, "cluster.router"),
    ("disagg-static", {"engine.policy": "static", "disaggregation": {"num_prefill_replicas": 1,
                                                                     "num_decode_replicas": 1}}, "disaggregation"),
    ("slo-negative", {"slo": {"ttft_ms": -1}}, "slo.ttft_ms"),
    ("slo-nan", {"slo": {"ttft_ms": NAN}}, "slo.ttft_ms"),
    ("search-over", {"search": {**SEARCH, "over": "engine.max_num_seqs"}}, "search.over"),
    ("search-range-reversed", {"search": {**SEARCH, "range": [8, 1]}}, "search.range"),
    ("search-range-inf", {"search": {**SEARCH, "range": [1, INF]}}, "search.range"),
    ("search-unknown-metric", {"search": {**SEARCH, "slo": {"ttft_p42_ms": 1}}}, "search.slo.ttft_p42_ms"),
    ("search-closed-rate", {"search": SEARCH, "workload.arrival": CLOSED}, "search.over"),
    ("capacity-without-search", {"capacity": {"target_rps": 10}}, "capacity"),
    # traces
    ("trace-is-folder", {"workload": {"trace": {**TRACE, "path": "{tmp}/list"}}}, "list: is a folder"),
    ("trace-missing", {"workload": {"trace": {**TRACE, "path": "{tmp}/nope.csv"}}}, "nope.csv"),
    ("trace-format", {"workload": {"trace": {**TRACE, "format": "parquet"}}}, "workload.trace.format"),
    ("trace-bad-value", {"workload": {"trace": {**TRACE, "path": "{tmp}/bad_trace.csv"}}}, "bad_trace.csv: line 3"),
    ("trace-inf-length", {"workload": {"trace": {**TRACE, "path": "{tmp}/inf_trace.csv"}}}, "inf_trace.csv: line 2"),
    ("trace-time-scale-zero", {"workload": {"trace": {**TRACE, "time_scale": 0}}}, "workload.trace.time_scale"),
    ("trace-time-scale-nan", {"workload": {"trace": {**TRACE, "time_scale": NAN}}}, "workload.trace.time_scale"),
    ("trace-long-prompts", {"workload": {"trace": {**TRACE, "long_prompts": "drop"}}}, "workload.trace.long_prompts"),
    ("trace-extra-key", {"workload": {"trace": TRACE, "num_requests": 3}}, "workload.num_requests"),
    # the command line and the file system
    ("out-is-a-file", ("argv", ["--out", "{tmp}/afile"]), "--out"),
    ("out-under-a-file", ("argv", ["--out", "{tmp}/afile/sub"]), "--out"),
    ("jobs-negative", ("argv", ["--jobs", "-1"]), "--jobs"),
    ("jobs-zero", ("argv", ["--jobs", "0"]), "--jobs"),
    ("jobs-word", ("argv", ["--jobs", "all"]), "--jobs"),
]


@pytest.fixture
def bad_files(tmp_path: Path) -> Path:
    good = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048}
    configs = {"list": [good], "strings": {**good, "num_attention_heads": "4"},
               "zero": {**good, "num_attention_heads": 0}, "missing": {k: v for k, v in good.items() if k != "hidden_size"},
               "kv": {**good, "num_key_value_heads": 3}}
    for name, cfg in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "invalid").mkdir()
    (tmp_path / "invalid" / "config.json").write_text("{not json")
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,16,4\n0.5,16,4\n")
    (tmp_path / "bad_trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,16,4\n0.5,lots,4\n")
    (tmp_path / "inf_trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,inf,4\n0.5,16,4\n")
    (tmp_path / "afile").write_text("not a folder")
    return tmp_path


def _subst(v, tmp: Path):
    if isinstance(v, str):
        return v.replace("{tmp}", str(tmp))
    if isinstance(v, dict):
        return {k: _subst(x, tmp) for k, x in v.items()}
    if isinstance(v, list):
        return [_subst(x, tmp) for x in v]
    return v


def _patched(patch: dict, tmp: Path) -> dict:
    sweep = copy.deepcopy(BASE)
    for dotted, value in patch.items():
        parts = dotted.split(".") if isinstance(dotted, str) else [dotted]
        d = sweep
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        if value is DELETE:
            d.pop(parts[-1])
        else:
            d[parts[-1]] = _subst(value, tmp)
    return sweep


def run_case(spec, tmp: Path) -> tuple[list[str], Path]:
    """The argument list for main() and the sweep file it reads."""
    f = tmp / "sweep.yaml"
    extra = []
    if isinstance(spec, str):
        f.write_text(spec)
    else:
        if isinstance(spec, tuple):
            extra, spec = [_subst(a, tmp) for a in spec[1]], {}
        f.write_text(yaml.safe_dump(_patched(spec, tmp), sort_keys=False))
    out = [] if "--out" in extra else ["--out", str(tmp / "out")]
    return [str(f), *out, "--quiet", "--no-plots", *(["--jobs", "1"] if "--jobs" not in extra else []), *extra], f


@pytest.mark.parametrize("spec, expected", [pytest.param(s, e, id=i) for i, s, e in CASES])
def test_bad_input_is_one_line_naming_it(spec, expected, bad_files, capsys):
    argv, _ = run_case(spec, bad_files)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own exit
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stderr: {err!r}"
    assert err.count("\n") == 1 and err.startswith("error: "), f"not one error line: {err!r}"
    assert expected in err, f"{expected!r} not named in {err!r}"
    assert "Traceback" not in err and not out


def test_at_least_sixty_cases():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("patch", [{"engine.block_size": 0}, {"engine.gpu_memory_utilization": 0.05},
                                   {"profile": "{tmp}/absent-profile.json"}, {"profile": "constant:per_step_s=x"}])
def test_nothing_written_before_the_sweep_is_valid(patch, bad_files, capsys):
    argv, _ = run_case(patch, bad_files)
    assert main(argv) == 2
    assert not (bad_files / "out").exists()  # a refused sweep leaves no half-made output folder


def test_yaml_booleans_are_accepted_for_the_fast_path_switch(tmp_path):
    """The README writes `fast_path: on`; YAML reads it as true, which means on."""
    from experiments.config import load_sweep_file, resolve_point
    f = tmp_path / "s.yaml"
    for word, mode in (("on", "on"), ("off", "off"), ("true", "on"), ("'auto'", "auto")):
        f.write_text(yaml.safe_dump(BASE).replace("policy: chunked_prefill", f"policy: chunked_prefill\n  fast_path: {word}"))
        assert resolve_point(load_sweep_file(f)).engine.fast_path == mode


def test_cli_subprocess_one_line(bad_files):
    """The real command: a NaN rate is refused with one line and exit 2."""
    argv, _ = run_case({"workload.arrival.rate_per_s": NAN}, bad_files)
    p = subprocess.run([sys.executable, "-m", "experiments.run", *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "workload.arrival.rate_per_s" in p.stderr


def test_cli_reader_gone_is_not_a_traceback(tmp_path):
    """`python -m experiments.run SWEEP | head`: a reader that stops early gets what it read; the command
    writes its results, says nothing on stderr and exits 0 (before: a BrokenPipeError traceback)."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({**BASE, "name": "pipe", "seeds": [0, 1, 2, 3]}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments.run", str(sweep), "--out", str(out), "--no-plots", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()   # the reader is gone before anything is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == ""
    assert len((out / "results.csv").read_text().splitlines()) == 5
