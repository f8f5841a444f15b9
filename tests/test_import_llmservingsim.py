"""calibration.import_llmservingsim: LLMServingSim's per-layer timings (fixture written here) -> measurement
rows calibration.fit takes."""
from __future__ import annotations

import pandas as pd
import pytest

from calibration import import_llmservingsim as imp
from calibration import measurements
from costmodels.catalog import get_model


def write_profiler(d):
    (d / "tp1").mkdir(parents=True)
    (d / "meta.yaml").write_text("vllm_version: 0.19.0\ngpu: NVIDIA GeForce RTX 4090\nhardware: RTX4090\n"
                                 "model: meta-llama/Llama-3.1-8B\n")
    rows = [(layer, t, 10.0 + t / 10) for layer in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "layernorm",
                                                    "act_fn", "rotary_emb", "embedding", "final_layernorm")
            for t in (1, 8, 64, 512)]
    pd.DataFrame(rows, columns=["layer", "tokens", "time_us"]).to_csv(d / "tp1" / "dense.csv", index=False)
    att = [(0, 0, b, k, 9.0 + b * k / 1e3) for b in (1, 8, 64) for k in (16, 256, 4096)]
    att += [(c, kv, 0, 0, 20.0 + c / 10) for c in (16, 256) for kv in (0, 512)]
    att += [(16, 0, 8, 256, 30.0)]   # a mixed row: left out
    pd.DataFrame(att, columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"]).to_csv(
        d / "tp1" / "attention.csv", index=False)
    pd.DataFrame([("lm_head", s, 100.0 + s) for s in (1, 8, 64)] + [("sampler", s, 50.0) for s in (1, 8, 64)],
                 columns=["layer", "sequences", "time_us"]).to_csv(d / "tp1" / "per_sequence.csv", index=False)
    return d


def test_rows_map_each_layer_to_its_family(tmp_path):
    rows, info = imp.import_profiler(write_profiler(tmp_path / "p"), get_model("llama-3.1-8b"))
    f = pd.DataFrame(rows)
    counts = f["family"].value_counts().to_dict()
    assert counts == {"gemm": 4 * 4 + 3, "elementwise": 4 * 4, "decode_attn": 9, "prefill_attn": 4, "sampling": 3}
    qkv = f[(f["family"] == "gemm") & (f["op"] == "qkv")]
    assert set(zip(qkv["n"], qkv["k"])) == {(6144, 4096)} and qkv["latency_s"].min() == pytest.approx(10.1e-6)
    assert set(f.loc[f["family"] == "gemm", "op"]) == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert info["framework"] == "vllm 0.19.0"


def test_cli_writes_measurements_and_bad_folder_is_one_line(tmp_path, capsys):
    assert imp.main([str(write_profiler(tmp_path / "p")), "--out", str(tmp_path / "m")]) == 0
    frame = pd.read_csv(tmp_path / "m" / measurements.TABLE)
    assert len(frame) == 51 and (frame["status"] == "ok").all()
    assert imp.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "m2"), "--model", "llama-3.1-8b",
                     "--gpu", "rtx-4090"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "meta.yaml" in err[0]
