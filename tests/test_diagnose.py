"""experiments.diagnose: the intervention confirms the log's answer on runs bound by construction; strict
command line (one line, exit 2), --help without side effects."""
from __future__ import annotations

import copy
import math

import pytest
import yaml

from experiments import diagnose
from experiments.config import expand
from tests.test_binding import SATURATED


def points(**engine):
    sweep = copy.deepcopy(SATURATED)
    sweep["engine"].update(engine)
    return expand(sweep)


def test_relaxing_the_sequence_cap_is_what_moves_a_cap_bound_run():
    df = diagnose.diagnose(points()).set_index("change")
    assert df.loc["baseline", "binding"] == "max_num_seqs"
    # 2 -> 4 sequences at a time, each step still 10 ms: twice the throughput
    assert df.loc["max_num_seqs_x2", "throughput_rps_gain"] == pytest.approx(1.0, rel=0.05)
    assert not df.loc["kv_x2", "moves"] and not df.loc["token_budget_x2", "moves"]
    # the constant stub has no GPU to speed up
    assert df.loc["compute_x1.25", "note"] == "not applicable to this point"
    words, agrees = diagnose.verdict(df.reset_index())
    assert agrees and words.startswith("Relaxing max_num_seqs_x2 moves the result most")


def test_relaxing_kv_is_what_moves_a_kv_bound_run():
    df = diagnose.diagnose(points(max_num_seqs=256, num_gpu_blocks=30))
    words, agrees = diagnose.verdict(df)
    assert df.iloc[0]["binding"] == "kv" and agrees, words


def test_speeds_act_through_the_roofline_ratio():
    cfg = points()[0].config
    cfg = copy.deepcopy(cfg)
    import dataclasses
    cfg = dataclasses.replace(cfg, profile="roofline")
    relaxed_cfg, cost = diagnose.relaxed(cfg, "bandwidth_x1.25")
    # a decode step of one sequence reads the weights: 1.25x the bandwidth makes it nearly 1.25x faster
    base = cost.real.step_time_s(decode=[200])
    assert cost.step_time_s(decode=[200]) / base == pytest.approx(1 / 1.25, rel=0.1)
    assert relaxed_cfg.engine.num_gpu_blocks is not None   # pinned to the baseline's pool


def write(tmp_path, sweep) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(sweep))
    return str(p)


def test_help_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        diagnose.main(["--help"])
    assert e.value.code == 0 and "one resource relaxed at a time" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, key", [
    (["missing.yaml"], "missing.yaml"),
    (["{sweep}", "--point", "p999"], "--point p999"),
    (["{grid}"], "--point: the sweep has 2 points"),
    (["{sweep}", "--bogus"], "unrecognized arguments"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, args, key):
    grid = copy.deepcopy(SATURATED)
    grid["grid"] = {"engine.max_num_seqs": [2, 4]}
    names = {"{sweep}": write(tmp_path, SATURATED), "{grid}": str(tmp_path / "g.yaml")}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    argv = [names.get(a, a) for a in args]
    with pytest.raises(SystemExit) if "--bogus" in args else _no_raise():
        rc = diagnose.main(argv)
        assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_command_prints_the_table_and_the_verdict(tmp_path, capsys):
    out = tmp_path / "d.csv"
    assert diagnose.main([write(tmp_path, SATURATED), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs_x2" in text and "agrees with the intervention" in text
    assert "\nrests on the cost model: " in text and "\nschedules as " in text   # what the answer rests on
    assert out.exists() and not math.isnan(float(out.read_text().splitlines()[1].split(",")[1]))
