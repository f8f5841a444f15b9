"""Decode-only steps recovered from a run's 1 s stat ticks (fidelity/run_ticks.py): a hand-built run whose
engine stepped every 20 ms gives back 20 ms, its clock offset and its contexts; the ticks the arithmetic
does not hold for are left out; the public runs, where present, give their own steps. And whole ticks,
prefill included: an engine stepped by a known cost gives that cost back, tick by tick."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fidelity import run_ticks

STEP_S, SHIFT_S = 0.02, 0.3   # the engine's step; the logger's clock runs this far ahead of the requests'


def hand_built_run():
    """8 requests decode over [0, 10) s, 4 others over [10, 20) s, one over [4.68, 7.72) s, one step every
    20 ms, each prefilled in the 50 ms before its first token; and one long prompt prefilled over [12.8,
    14.9) s, ticks 14-16, and done 2 tokens later. The stat logger ticks every second on a clock SHIFT_S
    ahead (the short request's start and end tell the offset to within 0.02 s), counting a prompt's tokens
    in the tick its prefill completes. Tick 5 has a full pool, and tick 18's running count is
    misrecorded."""
    rows = []
    for i in range(14):
        first, finish = ((0.0, 10.0) if i < 8 else (10.0, 20.0) if i < 12 else (4.68, 7.72) if i == 12
                         else (14.9, 14.94))
        rows.append({"status": "finished", "first_token_s": first, "finish_s": finish, "prompt_tokens": 1000 + i,
                     "output_tokens": int(round((finish - first) / STEP_S)) + 1,
                     "scheduled_s": 12.8 if i == 13 else first - 0.05})
    requests = pd.DataFrame(rows)
    ticks = []
    for t in range(1, 21):
        a, b = t - 1 - SHIFT_S, t - SHIFT_S   # the tick on the engine's clock
        batch = sum(max(0.0, min(r["finish_s"], b) - max(r["first_token_s"], a)) for r in rows)
        running = sum(r["first_token_s"] <= b < r["finish_s"] for r in rows)
        prompts = sum(r["prompt_tokens"] for r in rows if a < r["first_token_s"] <= b)
        ticks.append({"t": float(t), "prompt_throughput": float(prompts),
                      "gen_throughput": batch / STEP_S, "running": 20 if t == 18 else running,
                      "waiting": 0, "kv_cache_pct": 99.0 if t == 5 else 50.0})
    return requests, pd.DataFrame(ticks)


def test_a_steady_engine_gives_back_its_step_offset_and_contexts():
    requests, ts = hand_built_run()
    got = run_ticks.decode_ticks(requests, ts)
    assert got.offset_s == pytest.approx(-SHIFT_S)
    t = got.table.set_index("t")
    assert t["real_step_s"].to_numpy() == pytest.approx(STEP_S)
    # the first tick has prompts (and no tick before it), 5 a full pool and the short request's prompt, 11
    # four prompts, 14-16 the long prompt's chunks (16 its completed prompt too), 18 a count that disagrees
    # (and 19, whose start is 18's end); nothing else is dropped
    assert sorted(set(range(1, 21)) - set(t.index.astype(int))) == [1, 5, 11, 14, 15, 16, 18, 19]
    assert t.loc[3.0, "batch"] == pytest.approx(8) and t.loc[17.0, "batch"] == pytest.approx(4)
    mid = 3 - 0.5 - SHIFT_S   # tick 3's middle on the engine's clock: 2.2 s into 10 s of 500 decode steps
    assert t.loc[3.0, "context_mean"] == pytest.approx(1003.5 + mid / 10.0 * 500, abs=0.5)
    assert t.loc[3.0, "num_seqs"] == 8 and len(t.loc[3.0, "contexts"]) == 8


def test_a_tick_with_a_preemption_or_without_its_start_row_is_left_out():
    """Later runs count preemptions per tick; and the logger writes no row for a second without an
    iteration, so the row before such a gap is not the next tick's start."""
    requests, ts = hand_built_run()
    ts["preempted"] = np.where(ts["t"] == 3.0, 1, 0)
    ts = ts[ts["t"] != 7.0].reset_index(drop=True)
    kept = set(run_ticks.decode_ticks(requests, ts).table["t"].astype(int))
    assert 3 not in kept and 7 not in kept and 8 not in kept
    assert {2, 4, 6, 9, 10} <= kept


class StubModel:
    """A step of 1 ms a sequence plus 1 us a context token."""
    def step_time_s(self, prefill=(), decode=(), num_logits=None):
        return 1e-3 * len(decode) + 1e-6 * sum(decode)


def test_price_deals_the_requests_to_the_dp_ranks_and_takes_the_slowest():
    contexts = [100, 200, 300, 400, 500]
    assert run_ticks.price(StubModel(), contexts) == pytest.approx(5e-3 + 1.5e-3)
    # rank 0 gets 100, 300, 500; rank 1 gets 200, 400
    assert run_ticks.price(StubModel(), contexts, data_parallel_size=2) == pytest.approx(3e-3 + 0.9e-3)


def test_batch_curve_bins_the_ticks_by_requests_decoding():
    requests, ts = hand_built_run()
    table = run_ticks.decode_ticks(requests, ts).table
    curve = run_ticks.batch_curve(table, table["real_step_s"].to_numpy() * 1.1)
    assert list(curve["batch_bin"]) == ["(0, 4]", "(4, 16]"]
    assert curve["err"].to_numpy() == pytest.approx(0.1)
    assert curve["real_step_ms"].to_numpy() == pytest.approx(STEP_S * 1e3)
    assert curve["ticks"].sum() == len(table)


def test_a_bad_timeseries_is_one_line(tmp_path):
    p = tmp_path / run_ticks.TIMESERIES
    p.write_text("t,prompt_throughput\n1,0\n")
    with pytest.raises(run_ticks.TicksError, match="lacks column"):
        run_ticks.read_timeseries(p)
    p.write_text("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n2,0,1,1,0,1\n1,0,1,1,0,1\n")
    with pytest.raises(run_ticks.TicksError, match="increasing"):
        run_ticks.read_timeseries(p)


def write_decoding_run(d: Path) -> Path:
    """An LLMServingSim run folder (tests/test_llmservingsim_reader.py's, RTX 4090) whose 4 requests decode
    one token every 10 ms for 5.5 s after a 0.5 s prefill, and whose stat logger's ticks 2-6 saw only that."""
    import json
    from tests.test_llmservingsim_reader import write_run
    write_run(d, n=4)
    lines = [json.dumps({"request_id": f"r{i}", "input_toks": 1000, "output_toks": 551, "arrival_time": 1.7e9,
                         "queued_ts": 5000.0, "scheduled_ts": 5000.001, "first_token_ts": 5000.5,
                         "last_token_ts": 5000.5 + 550 * 0.01}) for i in range(4)]
    (d / "vllm_requests.jsonl").write_text("\n".join(lines) + "\n")
    rows = ["t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct", "1.0,4000.0,200.0,4,0,10.0"]
    rows += [f"{t}.0,0.0,400.0,4,0,10.0" for t in range(2, 7)]
    (d / run_ticks.TIMESERIES).write_text("\n".join(rows) + "\n")
    return d


def test_fidelity_compare_prices_a_runs_decode_only_seconds(tmp_path, capsys):
    """`python -m fidelity.compare` on an LLMServingSim run that kept only its stat logger's ticks: the step
    table gives the cost model's error on each decode-only second's step."""
    from fidelity import compare
    run = write_decoding_run(tmp_path / "RTX4090_Llama-3.1-8B")
    assert compare.main([str(run), "--profile", "roofline", "--out", str(tmp_path / "out")]) == 0
    steps = pd.read_csv(tmp_path / "out" / "compare_steps.csv")
    assert list(steps["from"]) == ["1 s ticks, decode-only"] and steps["steps"].iloc[0] == 5
    assert "1 s ticks, decode-only | 5 |" in capsys.readouterr().out


QWEN32B = Path(__file__).resolve().parents[2] / "shared/real-runs/llmservingsim/RTXPRO6000_Qwen3-32B"


@pytest.mark.skipif(not QWEN32B.exists(), reason="needs ../shared/real-runs (LLMServingSim's runs)")
def test_the_qwen3_32b_run_decodes_128_requests_in_about_60_ms_a_step():
    """The public run's decode-only seconds at its 128-sequence cap (vLLM 0.19, two RTX PRO 6000 at TP 2):
    its own ticks say a step took 56-64 ms, on two clocks the running counts tie within a second."""
    from fidelity.llmservingsim import read_run
    run = read_run(QWEN32B)
    got = run_ticks.decode_ticks(run.requests, run_ticks.read_timeseries(QWEN32B / run_ticks.TIMESERIES))
    full = got.table[got.table["batch"] > 127.5]
    assert len(full) >= 30 and abs(got.offset_s) <= 1.0 and got.running_mismatch < 1.0
    assert 0.056 <= np.median(full["real_step_s"]) <= 0.064


def test_fidelity_compare_refuses_a_bad_timeseries_in_one_line(tmp_path, capsys):
    """A run folder whose stat-logger file is malformed: one line naming the file, exit 2."""
    from fidelity import compare
    run = write_decoding_run(tmp_path / "RTX4090_Llama-3.1-8B")
    (run / run_ticks.TIMESERIES).write_text("t,prompt_throughput\n1,0\n")
    assert compare.main([str(run), "--profile", "roofline"]) == 2
    err = capsys.readouterr().err.strip()
    assert run_ticks.TIMESERIES in err and "lacks column" in err and "\n" not in err


class PrefillCostModel:
    """A step of `base_s`, plus `per_token_s` a prompt token it computes."""
    def __init__(self, base_s=0.010, per_token_s=5e-6):
        self.base_s, self.per_token_s = base_s, per_token_s

    def step_time_s(self, prefill=(), decode=(), num_logits=None):
        return self.base_s + self.per_token_s * sum(n for n, _ in prefill)


def engine_run(model, budget=512, seconds=12.0):
    """A chunked-prefill engine stepped in time by `model`: 6 requests decode throughout, and every 1.4 s a
    1,500-token prompt arrives, and a 6,000-token one at 5.9 s (its chunks run past the tick's end), each
    prefilled in chunks of what the budget leaves beside the decodes (first come first) and then decoding
    30 tokens. Returns the requests' table and the stat logger's 1 s ticks (tokens
    counted at each step's end; a prompt's tokens in the tick its prefill completes)."""
    reqs = [{"arrive": 0.0, "prompt": 800, "out": 10 ** 6, "done": 800, "first": 0.0, "sched": 0.0, "made": 1}
            for _ in range(6)]
    reqs += [{"arrive": 0.35 + 1.4 * k, "prompt": 1500, "out": 30, "done": 0, "first": None, "sched": None, "made": 0}
             for k in range(int(seconds / 1.4))]
    reqs.append({"arrive": 5.9, "prompt": 6000, "out": 30, "done": 0, "first": None, "sched": None, "made": 0})
    now, gen, prompts = 0.0, {}, {}
    while now < seconds:
        decoding = [r for r in reqs if r["first"] is not None and r["first"] <= now and r["made"] < r["out"]]
        chunks, left = [], budget - len(decoding)
        for r in reqs:
            if r["arrive"] <= now and r["first"] is None and left > 0:
                take = min(r["prompt"] - r["done"], left)
                chunks.append((r, take))
                left -= take
        step = model.step_time_s(prefill=[(n, r["done"]) for r, n in chunks], decode=[0] * len(decoding))
        now += step
        tick = int(np.ceil(now))
        for r in decoding:
            r["made"] += 1
            r["last"] = now
        gen[tick] = gen.get(tick, 0) + len(decoding)
        for r, n in chunks:
            r["sched"] = now - step if r["sched"] is None else r["sched"]
            r["done"] += n
            if r["done"] == r["prompt"]:
                r["first"], r["made"], r["last"] = now, 1, now
                gen[tick] += 1
                prompts[tick] = prompts.get(tick, 0) + r["prompt"]
    rows = [{"status": "finished", "first_token_s": r["first"], "finish_s": r["last"], "prompt_tokens": r["prompt"],
             "output_tokens": r["made"], "scheduled_s": r["sched"]} for r in reqs if r["first"] is not None]
    requests = pd.DataFrame(rows)
    ticks = []
    for t in range(1, int(seconds)):
        running = sum(r["first_token_s"] <= t < r["finish_s"] for r in rows)
        ticks.append({"t": float(t), "prompt_throughput": float(prompts.get(t, 0)),
                      "gen_throughput": float(gen.get(t, 0)), "running": running, "waiting": 0, "kv_cache_pct": 50.0})
    return requests, pd.DataFrame(ticks)


def test_busy_ticks_priced_with_the_engines_own_cost_come_to_their_length():
    """The engine above, its ticks priced whole with the very cost that stepped it: every tick, with prefill
    or without, comes to its second within a few percent; a model that doubles the prefill's cost is that
    much over on the ticks with prefill only; and the prompt tokens priced match the logger's count."""
    real = PrefillCostModel()
    requests, ts = engine_run(real)
    busy = run_ticks.busy_ticks(requests, ts).table
    mixed = busy["prefill_tokens"] > 0
    assert mixed.sum() >= 5 and (~mixed).sum() >= 2
    right = np.array([run_ticks.price_busy_tick(real, t.contexts, t.prefill, t.steps, 512) for t in busy.itertuples()])
    assert np.abs(right - 1.0).max() < 0.05
    dear = PrefillCostModel(per_token_s=10e-6)
    over = np.array([run_ticks.price_busy_tick(dear, t.contexts, t.prefill, t.steps, 512) for t in busy.itertuples()])
    prefill_share = busy["prefill_tokens"].to_numpy() * 5e-6   # the seconds of each tick spent prefilling
    assert over - right == pytest.approx(prefill_share, abs=0.01)
    summary = run_ticks.busy_summary(busy, right).set_index("ticks")
    assert abs(summary.loc["all", "time_err"]) < 0.02
    assert summary.loc["all", "prefill_tokens_per_tick"] == pytest.approx(
        summary.loc["all", "logged_prompt_tokens_per_tick"], rel=0.15)


def test_price_busy_tick_packs_the_prompts_into_the_token_budget():
    """Two prompts of 300 and 500 tokens beside 12 decodes, a budget of 412: the first step takes 300 + 100,
    the second 400 (the second prompt's tokens 100-499), and the tick's other steps decode only."""
    calls = []

    class Recorder:
        def step_time_s(self, prefill=(), decode=(), num_logits=None):
            calls.append(list(prefill))
            return 0.01
    assert run_ticks.price_busy_tick(Recorder(), [100] * 12, [(300, 0), (500, 0)], 10.0, 412) == pytest.approx(0.1)
    assert calls[1:] == [[(300, 0), (100, 0)], [(400, 100)]]


def test_fidelity_compare_prices_the_seconds_that_carried_prefill_whole(tmp_path):
    """An LLMServingSim run folder holding the engine above's requests and ticks: `fidelity.compare` gives a
    row for its decode-only seconds and one for those that carried prefill, each priced whole."""
    import json
    from fidelity import compare
    from tests.test_llmservingsim_reader import write_run
    requests, ts = engine_run(PrefillCostModel(), budget=1024)   # the folder's recorded token budget
    d = write_run(tmp_path / "RTX4090_Llama-3.1-8B", n=1)
    lines = [json.dumps({"request_id": f"r{i}", "input_toks": int(r.prompt_tokens), "output_toks": int(r.output_tokens),
                         "arrival_time": 1.7e9 + r.scheduled_s, "queued_ts": 5000.0 + r.scheduled_s,
                         "scheduled_ts": 5000.0 + r.scheduled_s, "first_token_ts": 5000.0 + r.first_token_s,
                         "last_token_ts": 5000.0 + r.finish_s}) for i, r in enumerate(requests.itertuples())]
    (d / "vllm_requests.jsonl").write_text("\n".join(lines) + "\n")
    ts.to_csv(d / run_ticks.TIMESERIES, index=False)
    assert compare.main([str(d), "--profile", "roofline", "--out", str(tmp_path / "out")]) == 0
    steps = pd.read_csv(tmp_path / "out" / "compare_steps.csv").set_index("from")
    assert list(steps.index) == ["1 s ticks, decode-only", "1 s ticks, with prefill (whole ticks)"]
    assert steps.loc["1 s ticks, with prefill (whole ticks)", "steps"] >= 5
    assert np.isfinite(steps["total_time_err_pct"]).all()
