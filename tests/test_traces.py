"""Trace loaders: every format on small generated files, malformed files, selection, replay wiring."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.config import expand, load_sweep_file, resolve_point
from experiments.simulate import simulate
from workloads.errors import WorkloadError
from workloads.synthetic import generate, parse_workload
from workloads.traces import engine_block_ids, load_trace, parse_trace_workload, trace_specs

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_azure(tmp_path):
    p = write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:47.5000000,100,10\n2023-11-16 18:15:46.0000000,200,20\n"
              "2023-11-16 18:15:49.2500000,300,30\n")
    tr = load_trace(p, "azure")
    assert tr.arrival_s.tolist() == [0.0, 1.5, 3.25]  # sorted by time, from the first request
    assert tr.prompt_tokens.tolist() == [200, 100, 300] and tr.output_tokens.tolist() == [20, 10, 30]
    assert tr.prefix_ids is None


def test_mooncake_and_block_mapping(tmp_path):
    lines = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
             {"timestamp": 3000, "input_length": 600, "output_length": 7, "hash_ids": [0, 3]}]
    p = write(tmp_path, "mc.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    tr = load_trace(p, "mooncake")
    assert tr.arrival_s.tolist() == [0.0, 3.0]
    assert tr.prefix_ids == ((0, 1, 2), (0, 3))
    assert tr.repeated_block_fraction() == pytest.approx(1 / 5)
    specs = trace_specs(parse_trace_workload({"path": p, "format": "mooncake"}), 8192, block_size=256).specs
    # 1100 tokens = 4 full 256-token blocks; blocks 0-1 lie in source block 0, 2-3 in source block 1.
    assert specs[0].prefix_block_ids == (0, 1, 2**20 + 2, 2**20 + 3)
    assert specs[1].prefix_block_ids == (0, 1)  # shares the first 512 tokens with request 0
    assert len(engine_block_ids((7,), 512, 512, 16)) == 32


def test_burstgpt_drops_failures(tmp_path):
    p = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "5,ChatGPT,472,18,490,Conversation log\n10,GPT-4,1000,0,1000,API log\n"
              "12.5,ChatGPT,30,40,70,Conversation log\n")
    tr = load_trace(p, "burstgpt")
    assert tr.arrival_s.tolist() == [0.0, 7.5] and tr.prompt_tokens.tolist() == [472, 30]
    assert tr.num_dropped == 1


def test_generic_csv_and_jsonl(tmp_path):
    c = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens,max_new_tokens,prefix_block_ids\n"
              "0.5,40,3,8,4 5\n0.0,20,2,2,\n")
    tr = load_trace(c, "csv", prefix_block_tokens=16)
    assert tr.prompt_tokens.tolist() == [20, 40] and tr.max_new_tokens.tolist() == [2, 8]
    assert tr.prefix_ids == (None, (4, 5))
    j = write(tmp_path, "g.jsonl", '{"arrival_s": 0, "prompt_tokens": 64, "output_tokens": 2, '
              '"prefix_group": "sys-a", "prefix_tokens": 40}\n'
              '{"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 2, "prefix_group": "sys-a", "prefix_tokens": 40}\n'
              '{"arrival_s": 2, "prompt_tokens": 50, "output_tokens": 2, "prefix_group": "sys-b", "prefix_tokens": 40}\n'
              '{"arrival_s": 3, "prompt_tokens": 50, "output_tokens": 2}\n')
    tr = load_trace(j, "jsonl")
    assert tr.prefix_groups.tolist() == [[0, 40], [0, 40], [1, 40], [-1, 0]]
    specs = trace_specs(parse_trace_workload({"path": j, "format": "jsonl"}), 8192, block_size=16).specs
    ids = [s.prefix_block_ids for s in specs]
    assert ids[0] == ids[1] and len(ids[0]) == 2  # 40 shared tokens: two full 16-token blocks
    assert set(ids[2]).isdisjoint(ids[0]) and ids[3] is None


@pytest.mark.parametrize("fmt,text,expect", [
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,10,1\n2023-11-16 18:15:47.0,x,1\n",
     ": line 3, column ContextTokens: expected an integer >= 0, got 'x'"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,1\n", ": line 2, column TIMESTAMP: expected a timestamp"),
    ("azure", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.0,10,1\n", ": line 1: missing column 'ContextTokens'"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5,\n',
     ": line 2, column 36: invalid JSON"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0, "a"]}\n',
     ": line 1, column hash_ids: expected a list of integer block ids"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,m,5,-1,4,x\n",
     ": line 2, column Response tokens: expected an integer >= 0, got -1"),
    ("csv", "arrival_s,prompt_tokens,output_tokens\n0,5,1\n-2,5,1\n", ": line 3, column arrival_s: expected a non-negative"),
    ("csv", "arrival_s,prompt_tokens,output_tokens\n0,5,1,7\n", ": line 2, column 4: expected 3 fields as in the header, saw 4"),
    ("jsonl", '{"arrival_s": 0, "prompt_tokens": 5.5, "output_tokens": 1}\n', ": line 1, column prompt_tokens"),
    ("jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prefix_group": 1, "prefix_tokens": 4}\n'
              '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 1, "prefix_group": 1}\n', ": line 2, column prefix_tokens"),
    ("csv", "", ": empty file"),
])
def test_malformed_files_name_file_line_and_column(tmp_path, fmt, text, expect):
    p = write(tmp_path, "bad." + ("jsonl" if fmt in ("mooncake", "jsonl") else "csv"), text)
    with pytest.raises(WorkloadError) as e:
        load_trace(p, fmt)
    msg = str(e.value)
    assert msg.startswith(p) and expect in msg and "\n" not in msg


def test_missing_file_and_bad_keys(tmp_path):
    with pytest.raises(WorkloadError, match="no such trace file"):
        load_trace(str(tmp_path / "nope.csv"), "azure")
    with pytest.raises(WorkloadError, match="workload.trace.format"):
        parse_workload({"trace": {"path": "x", "format": "parquet"}})
    with pytest.raises(WorkloadError, match="workload.trace.speed: unknown key"):
        parse_workload({"trace": {"path": "x", "format": "azure", "speed": 2}})
    with pytest.raises(WorkloadError, match="workload.num_requests: not used with a trace"):
        parse_workload({"trace": {"path": "x", "format": "azure"}, "num_requests": 3})
    with pytest.raises(WorkloadError, match="time_scale: expected a number > 0"):
        parse_workload({"trace": {"path": "x", "format": "azure", "time_scale": 0}})


def test_time_scale_window_first_n_and_closed_loop(tmp_path):
    p = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n" +
              "".join(f"{t},{10 + t},{1 + t}\n" for t in range(10)))
    w = parse_workload({"trace": {"path": p, "format": "csv", "time_scale": 2, "start_s": 3, "end_s": 8,
                                  "num_requests": 3}})
    specs = generate(w, 0, 4096).specs
    assert [s.arrival_s for s in specs] == [0.0, 0.5, 1.0]  # rows 3, 4, 5 at twice the rate
    assert [s.num_prompt_tokens for s in specs] == [13, 14, 15]
    closed = parse_workload({"trace": {"path": p, "format": "csv", "concurrency": 2}})
    assert closed.arrival.is_closed and closed.arrival.concurrency == 2
    assert all(s.arrival_s == 0 for s in generate(closed, 0, 4096).specs)


def test_replay_through_a_sweep_file(tmp_path):
    write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n" +
          "".join(f"{0.1 * i},{100 + i},{4 + i % 3}\n" for i in range(20)))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("model: llama-3-8b\nhardware: h100-sxm\nworkload: {trace: {path: t.csv, format: csv}}\n"
                     "grid: {workload.trace.time_scale: [1, 4]}\n")
    raw = load_sweep_file(sweep)
    assert raw["workload"]["trace"]["path"] == str(tmp_path / "t.csv")  # relative to the sweep file
    raw.pop("grid")
    res = simulate(raw, seed=0)
    assert res.summary["num_finished"] == 20
    assert res.resolved["workload"]["trace"]["format"] == "csv"


@pytest.mark.skipif(not (SHARED / "AzureLLMInferenceTrace_conv.csv").exists(),
                    reason="real traces not present in ../shared/traces")
def test_real_traces_match_published_statistics():
    conv = load_trace(str(SHARED / "AzureLLMInferenceTrace_conv.csv"), "azure")
    assert len(conv) == 19366
    assert len(conv) / conv.duration_s == pytest.approx(5.53, rel=0.01)
    assert conv.prompt_tokens.mean() == pytest.approx(1155, rel=0.01)
    mc = load_trace(str(SHARED / "conversation_trace.jsonl"), "mooncake")
    assert len(mc) == 12031
    assert mc.repeated_block_fraction() == pytest.approx(0.366, abs=0.001)
    assert np.median(mc.output_tokens) == pytest.approx(350, abs=1)


@pytest.mark.parametrize("name", ["trace_azure_replay", "trace_mooncake_prefix", "trace_mooncake_routing", "routing", "prefix_sessions"])
def test_example_sweeps_resolve(name):
    """Every example sweep loads and resolves (the trace files themselves are read only when run)."""
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.yaml"
    points = expand(load_sweep_file(path))
    assert len(points) >= 2
    for p in points:
        w = p.config.workload
        if hasattr(w, "path"):
            assert Path(w.path).is_absolute() and Path(w.path).parent.resolve() == SHARED.resolve()
