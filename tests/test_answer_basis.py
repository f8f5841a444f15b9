"""Every answer names what it rests on, and the search states both sides of the work and its spread:
the console, summary.md, results.csv, search.csv, capacity.csv and every plot's title are read back."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from experiments import plots, run

PROFILE = "measured profile llama-3-8b__h100-sxm__tp1__bf16"
WORKLOAD = {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 1},
            "prompt_tokens": {"dist": "lognormal", "median": 1500, "sigma": 0.3, "max": 4096},
            "output_tokens": {"dist": "lognormal", "median": 50, "sigma": 0.3, "max": 256}}


@pytest.fixture
def titles(monkeypatch):
    seen = []
    real = plots._title

    def record(title):
        seen.append(title)
        return real(title)
    monkeypatch.setattr(plots, "_title", record)
    return seen


def sweep_file(tmp_path, **extra):
    sweep = {"name": "basis", "seeds": [0, 1], "model": "meta-llama/Llama-3-8B-Instruct", "hardware": "h100-sxm",
             "engine": {"policy": "chunked_prefill"}, "workload": WORKLOAD, **extra}
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump(sweep))
    return f


def test_a_search_and_plan_name_their_cost_model_everywhere(tmp_path, capsys, titles):
    f = sweep_file(tmp_path, search={"over": "workload.arrival.rate_per_s", "slo": {"ttft_p99_ms": 400},
                                     "range": [1, 16], "rel_tolerance": 0.25},
                   capacity={"target_rps": 20, "gpu_price_per_hour": 2.5, "verify": False})
    assert run.main([str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--progress", "plain"]) == 0
    out, err = capsys.readouterr()
    assert f"rests on the cost model: {PROFILE}" in out and "median held-out error" in out
    assert "schedules as chunked_prefill: vLLM V1's scheduler, step for step as vLLM 0.32.0's" in out
    assert "input and" in out and "saturates at" in out
    assert "\r" not in err and "search: 1 of 1 searches done (100%)" in err   # plain lines, not a bar
    s = pd.read_csv(tmp_path / "out" / "search.csv").iloc[0]
    assert s["cost_model_basis"].startswith(PROFILE)
    assert s["input_tok_per_s"] > 10 * s["output_tok_per_s"]           # 1,500-token prompts, 50-token answers
    assert 0 < s["prefill_time_share"] <= 1
    assert s["max_value"] <= s["seed_max_low"] <= s["seed_max_high"]   # every seed passes what all seeds pass
    assert s["saturation_rps"] >= s["throughput_rps"]
    cap = pd.read_csv(tmp_path / "out" / "capacity.csv").iloc[0]
    assert cap["cost_model_basis"].startswith(PROFILE)
    assert cap["cost_per_million_input_tokens"] < cap["cost_per_million_output_tokens"]
    assert cap["cost_per_million_total_tokens"] < cap["cost_per_million_input_tokens"]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert f"**Rests on** the cost model: {PROFILE}" in md and "per million tokens" in md
    assert "; it schedules as chunked_prefill: vLLM V1's scheduler" in md
    assert "not the answer's precision" in md
    assert titles and all("cost model: measured profile" in t for t in titles), titles
    assert any("each at its SLO maximum, all requests" in t for t in titles)   # open loop: no warm-up to drop


def test_a_plain_sweep_names_its_cost_model_in_results_console_summary_and_plots(tmp_path, capsys, titles):
    f = sweep_file(tmp_path, seeds=[0], profile="roofline")
    assert run.main([str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rests on the cost model: roofline prior of batchsim" in out
    assert "\nschedules as chunked_prefill: vLLM V1's scheduler" in out and "one seed per point" in out
    res = pd.read_csv(tmp_path / "out" / "results.csv")
    assert res["cost_model_basis"].str.startswith("roofline prior").all()
    assert list(res["input_tok_per_s"] + res["output_tok_per_s"]) == pytest.approx(list(res["total_tok_per_s"]))
    assert (res["input_tok_per_s"] > 10 * res["output_tok_per_s"]).all()   # 1,500-token prompts, 50-token answers
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "**Rests on** the cost model: roofline prior" in md and "| input_tok_per_s |" in md
    assert "it schedules as chunked_prefill" in md and "one seed per point (one draw of the traffic" in md
    assert titles and all("cost model: roofline prior" in t for t in titles)


def test_silent_corners_warn_in_one_line(tmp_path, capsys):
    f = sweep_file(tmp_path, seeds=[0], data_parallel_size=2, hardware="h200-sxm",
                   profile="llama-3-8b__h100-sxm__tp1__bf16")
    assert run.main([str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "warning: data_parallel_size: 2 ranks, but one engine is simulated (no cluster:)" in err
    assert "warning: profile: measured on h100-sxm, simulating hardware h200-sxm" in err


def test_the_search_cdf_counts_the_requests_the_search_measured(tmp_path):
    """Closed loop: each user's first request (the t = 0 burst) and the last ones are not in the CDF at the
    answer, as they are not in the search's p99."""
    import json

    import numpy as np

    from experiments.report import _requests_cdf_input
    from experiments.search import parse_search
    from experiments.tables import write_run_tables
    users, n = 4, 20
    ttft = np.where(np.arange(n) < users, 9.0, 0.1)     # the burst: 9 s
    ttft[-users:] = 5.0                                  # the tail: 5 s
    req = pd.DataFrame({"request_id": np.arange(n), "status": "finished", "ttft_s": ttft})
    write_run_tables(tmp_path, req, None, ([], []), "csv")
    (tmp_path / "summary.json").write_text(json.dumps({"value": users}))
    spec = parse_search({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 200}, "range": [1, 8]})
    measured, _ = _requests_cdf_input(tmp_path, spec)
    assert sorted(measured) == [100.0] * (n - 2 * users)
    everything, _ = _requests_cdf_input(tmp_path)          # a plain sweep's CDF keeps every request
    assert len(everything) == n


def test_answers_resting_on_different_cost_models_say_so():
    from costmodels.basis import rests_on
    one = rests_on({"a": "measured profile X", "b": "measured profile X"})
    assert one == "cost model: measured profile X"
    two = rests_on({"llama": "measured profile X", "qwen": "NVIDIA kernel tables: Y"})
    assert "llama: measured profile X" in two and "qwen: NVIDIA kernel tables: Y" in two
    assert "different cost models" in two and "profile:" in two


def test_a_deployment_the_shipped_profile_cannot_price_is_warned_about():
    from experiments.config import resolve_point
    from experiments.config_warnings import point_warnings
    from experiments.simulate import point_cost_model
    cfg = resolve_point({"model": "llama-3.1-8b", "hardware": "h100-sxm", "kv_cache_dtype": "fp8",
                         "engine": {"policy": "chunked_prefill"}, "workload": WORKLOAD})
    lines = point_warnings(cfg, point_cost_model(cfg).describe())
    assert any(line.startswith("a measured profile (llama-3-8b__h100-sxm__tp1__bf16) exists for llama-3.1-8b")
               for line in lines), lines
    plain = resolve_point({"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": {"policy": "chunked_prefill"},
                           "workload": WORKLOAD})
    assert point_warnings(plain, point_cost_model(plain).describe()) == []


def test_a_family_with_nothing_held_out_is_said_so():
    from costmodels.basis import _profile_error
    text = _profile_error({"gemm": {"held_out_median_ape": 2.0}, "sampling": {"held_out_median_ape": None}})
    assert text == "median held-out error gemm 2.0%, sampling none held out"


def test_a_plain_sweep_reports_the_prefill_share_of_gpu_time():
    """Both sides of the work: the share of GPU time in steps carrying prefill, from the run's own steps."""
    import pandas as pd
    from experiments.simulate import prefill_time_share
    steps = pd.DataFrame({"duration_s": [0.03, 0.01, 0.01, 0.0], "prefill_tokens": [512, 0, 0, 16]})
    assert prefill_time_share(steps) == pytest.approx(0.6)
    assert math.isnan(prefill_time_share(steps.iloc[:0]))


def test_a_table_family_the_guard_dropped_is_named_as_priced_by_the_prior():
    from costmodels.basis import basis_line
    line = basis_line({"kind": "aic", "source": "tables",
                       "held_out_error": {"gemm_bf16": {"median_pct": 3.0}, "moe": {"median_pct": 4.1}},
                       "table_guard": {"moe": "7.1x the roofline at (8192,)"}})
    assert "gemm_bf16 3.0%" in line and "moe 4.1%" not in line
    assert "the roofline prior instead for moe (7.1x the roofline at (8192,))" in line
    clean = basis_line({"kind": "aic", "source": "tables", "held_out_error": {"moe": {"median_pct": 4.1}},
                        "table_guard": "every table family within its bounds"})
    assert "moe 4.1%" in clean and "instead" not in clean and "weight GEMMs" not in clean
    # a weight format the tables have no rows for: the bulk of the step is the prior's, and the line says so
    int8 = basis_line({"kind": "aic", "source": "tables", "held_out_error": {"gemm_bf16": {"median_pct": 3.0}},
                       "family_sources": {"gemm_weights": "roofline prior (no int8 GEMM rows)"}})
    assert int8.endswith("; the roofline prior for the weight GEMMs (no int8 GEMM rows)")


def test_curves_of_one_policy_never_share_a_colour():
    """Two GPUs (or two budgets) of one policy are two colours; the first keeps its policy's own, and no
    spare colour is a policy's."""
    colors = plots._palette(["chunked_prefill, hardware=h100-sxm", "chunked_prefill, hardware=l40s",
                             "static", "continuous", "continuous, max_num_seqs=64", "my-policy"])
    assert colors["chunked_prefill, hardware=h100-sxm"] == plots.COLORS["chunked_prefill"]
    assert (colors["static"], colors["continuous"]) == (plots.COLORS["static"], plots.COLORS["continuous"])
    assert len(set(colors.values())) == 6
    from matplotlib.colors import to_hex
    assert not {to_hex(c) for c in plots.SPARE_COLORS} & {to_hex(c) for c in plots.COLORS.values()}


def test_a_figure_gives_where_the_real_run_checks_are_not_their_errors():
    from costmodels.basis import rests_on
    line = ("roofline prior of batchsim X (not measured); checked on h100-sxm against real vLLM (median "
            "|error|, range; docs/fidelity/gpu): 0.15.1, 24 load stages: per-token 2.2% (-6..+6%)")
    assert rests_on({"a": line}, brief=True) == ("cost model: roofline prior of batchsim X (not measured); "
                                                 "checked on h100-sxm against real vLLM runs (docs/fidelity/gpu)")
    assert rests_on({"a": line}) == f"cost model: {line}"


@pytest.mark.parametrize("tp, hardware, words", [
    (2, "h100-sxm", "2x h100-sxm"), (1, "swept", "1x GPU (swept)"), ("swept", "h100-sxm", "h100-sxm, TP swept"),
    (1, {"base": "l40s", "hbm_bytes_per_s": 1e12}, "1x l40s-custom"), (1, {"name": "my-gpu"}, "1x my-gpu"),
    (1, "gpus/mine.yaml", "1x the GPU in mine.yaml")])
def test_a_figure_names_the_gpu_as_the_sweep_gave_it(tp, hardware, words):
    """A mapping of figures is named, not printed as a dict; a swept GPU is said to be swept."""
    from experiments.report import _gpus
    assert _gpus(tp, hardware) == words


def test_a_cluster_routed_as_vllms_dp_front_end_says_which_release_routes_it(tmp_path, capsys):
    f = sweep_file(tmp_path, seeds=[0], profile="roofline", cluster={"num_replicas": 2, "router": "vllm_dp"},
                   grid={"engine.vllm_version": ["0.19.0", "0.32.0"]})
    assert run.main([str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("routes as vLLM 0.19.0's DP front end (its ranks publish no counts, so requests go round robin, "
            "blind to load); routes as vLLM 0.32.0's DP front end (max(in-flight, waiting + running)") in out
    res = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(res["router_basis"].str.slice(0, 11)) == ["vLLM 0.19.0", "vLLM 0.32.0"]
    assert "routes as vLLM 0.19.0's DP front end" in (tmp_path / "out" / "summary.md").read_text()
    # a router that imitates no engine adds nothing
    f = sweep_file(tmp_path, seeds=[0], profile="roofline", cluster={"num_replicas": 2})
    assert run.main([str(f), "--out", str(tmp_path / "plain"), "--jobs", "1", "--quiet", "--no-plots"]) == 0
    assert "routes as" not in capsys.readouterr().out
    assert "router_basis" not in pd.read_csv(tmp_path / "plain" / "results.csv")


def test_every_policy_names_the_engine_and_version_it_imitates():
    from experiments.answer_basis import seeds_line
    from policies import POLICIES, imitated
    assert all(p.imitates for p in POLICIES.values())
    words = imitated(["sglang", "chunked_prefill", "sglang", "not-a-policy"])
    assert words.startswith("sglang: SGLang 0.5.10's scheduler; chunked_prefill: vLLM V1's scheduler")
    assert words.count("sglang:") == 1 and "not-a-policy" not in words
    assert seeds_line(3).startswith("3 seeds per point") and "not measured" in seeds_line(1)


def test_a_label_names_each_swept_setting_by_its_shortest_unambiguous_ending():
    from experiments.report import _label, short_names
    keys = ["workload.prompt_tokens.median", "workload.output_tokens.median", "engine.max_num_seqs"]
    assert short_names(keys) == {"workload.prompt_tokens.median": "prompt_tokens.median",
                                 "workload.output_tokens.median": "output_tokens.median",
                                 "engine.max_num_seqs": "max_num_seqs"}
    row = {"policy": "continuous", "workload.prompt_tokens.median": 512.0, "workload.output_tokens.median": 256,
           "engine.max_num_seqs": float("nan")}   # a knob this policy does not have
    assert _label(row, keys) == "continuous, prompt_tokens.median=512, output_tokens.median=256"


def test_a_figure_describes_swept_or_replayed_traffic_without_guessing():
    """A workload swept whole, a length distribution swept whole (which crashed the report) and a trace
    replay are said as such, not as '? arrivals, prompt ?()'."""
    from experiments.report import describe_setup
    base = {"model": "m", "workload": {"arrival": {"process": "poisson", "rate_per_s": 2},
                                       "prompt_tokens": {"dist": "fixed", "value": 1},
                                       "output_tokens": {"dist": "fixed", "value": 2}}}
    assert describe_setup({**base, "grid": {"workload": [{}, {}]}}) == "m on 1x h100-sxm, workloads swept"
    assert describe_setup({**base, "grid": {"workload.prompt_tokens": [{}, {}]}}).endswith(
        "prompt swept, output fixed(value=2)")
    trace = {"model": "m", "workload": {"trace": {"path": "traces/x.csv", "format": "azure"}}}
    assert describe_setup(trace) == "m on 1x h100-sxm, trace replay (x.csv)"


def test_a_legend_of_long_labels_goes_below_the_axes_wrapped():
    """Labels of whole workloads or autoscalers swept would cover the axes (and defeat tight_layout)."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot([1, 2], [1, 2], label="short")
    assert plots._legends(fig, [ax]) == (0, 0, 1, 1) and ax.get_legend() is not None
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot([1, 2], [1, 2], label="chunked_prefill, " + ", ".join(f"setting_{i}=value" for i in range(20)))
    rect = plots._legends(fig, [ax])
    assert ax.get_legend() is None and len(fig.legends) == 1 and rect[1] > 0
    assert fig.get_size_inches()[1] > 4.6 and "\n" in fig.legends[0].get_texts()[0].get_text()
    plt.close(fig)
