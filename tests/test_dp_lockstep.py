"""The DP ranks of an MoE model step together (simcore/dp_lockstep.py): a step ends with the group's
slowest, a rank ready mid-round starts with the next round, and a DP cluster of an MoE model runs that way
(on the SimPy engines; the fast path says why it does not)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import simpy

from experiments.config import ConfigError, resolve_point
from experiments.fast import fast_path_reason
from experiments.simulate import simulate
from simcore.dp_lockstep import GroupTokens, LockstepGroup, dp_group_size

TINY_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
            "vocab_size": 1024, "max_position_embeddings": 4096, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 128, "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_steps_that_start_together_end_with_the_slowest_and_a_late_rank_waits_for_the_next_round():
    env = simpy.Environment()
    group = LockstepGroup(env)
    seen = {}

    def rank(name, ready_s, steps):
        yield env.timeout(ready_s)
        for i, d in enumerate(steps):
            seen[(name, i)] = yield from group.step(d)

    env.process(rank("a", 0.0, [1.0, 1.0]))
    env.process(rank("b", 0.0, [3.0]))
    env.process(rank("c", 0.5, [0.25]))   # ready while the first round (0 -> 3) is in flight
    env.run()
    assert seen[("a", 0)] == (0.0, 3.0) and seen[("b", 0)] == (0.0, 3.0)   # a's 1 s step waits for b's 3 s
    assert seen[("a", 1)] == (3.0, 4.0) and seen[("c", 0)] == (3.0, 4.0)   # c joins a's second round


def test_only_an_moe_model_with_dp_ranks_steps_together():
    assert dp_group_size(True, 4) == 4
    assert dp_group_size(False, 4) == 1 and dp_group_size(True, 1) == 1


def _point(tmp_path, **over):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY_MOE))
    point = {"model": str(f), "hardware": "h100-sxm", "data_parallel_size": 2, "enable_expert_parallel": True,
             "cluster": {"num_replicas": 2, "router": "round_robin"},
             "engine": {"policy": "chunked_prefill", "max_model_len": 4096},
             "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": 50},
                          "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 0.8, "max": 3000},
                          "output_tokens": {"dist": "lognormal", "median": 40, "sigma": 0.5, "max": 200}}}
    point.update(over)
    return resolve_point(point)


def test_a_dp_cluster_of_an_moe_model_steps_in_rounds(tmp_path):
    cfg = _point(tmp_path)
    assert "step" in fast_path_reason(cfg, ())   # the SimPy engines run it
    it = simulate(cfg, 0).iterations
    ends = it.assign(end_s=it["start_s"] + it["duration_s"])
    by_replica = [set(zip(g["start_s"].round(12), g["end_s"].round(12))) for _, g in ends.groupby("replica_id")]
    both = by_replica[0] & by_replica[1]
    # every step that both ranks ran at the same start is one round: same start, same end
    starts = [{s for s, _ in r} for r in by_replica]
    assert len(both) == len(starts[0] & starts[1]) > 10
    # and each rank's steps never overlap the other's rounds partially: a step of one rank that starts while
    # the other's is in flight does not exist
    for mine, theirs in ((by_replica[0], by_replica[1]), (by_replica[1], by_replica[0])):
        for s, e in mine:
            assert not any(s2 < s < e2 for s2, e2 in theirs), (s, e)


def test_a_cluster_that_is_not_whole_dp_groups_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^cluster\.num_replicas: 3 is not a whole number of DP groups"):
        _point(tmp_path, cluster={"num_replicas": 3, "router": "round_robin"})


def test_the_experts_run_over_the_largest_rank_padded_under_cuda_graphs_else_over_the_ranks_sum():
    from simcore.dp_lockstep import GroupTokens, cuda_graph_max_tokens, group_tokens
    # vLLM's largest graph: min(2 x max_num_seqs, 512), within the token budget
    assert cuda_graph_max_tokens(256, 2048) == 512 and cuda_graph_max_tokens(128, 2048) == 256
    assert cuda_graph_max_tokens(256, 128) == 128 and cuda_graph_max_tokens(None, None) == 512
    # every rank under a graph: all padded to the largest, an idle rank's dummy batch too; each GPU receives
    # the other ranks' padded shares
    assert group_tokens([40, 300], 2, 512) == GroupTokens(600, 300)
    assert group_tokens([40], 4, 512) == GroupTokens(160, 120)
    # one rank past the graph: nobody padded; the idle ranks' dummy batches are one token each, and a ring's
    # busiest link carries every share but the smallest
    assert group_tokens([2048, 40], 2, 512) == GroupTokens(2088, 2048)
    assert group_tokens([2048], 4, 512) == GroupTokens(2051, 2050)
    assert group_tokens([2048, 600, 40, 8], 4, 512) == GroupTokens(2696, 2688)


def test_a_round_prices_each_rank_with_the_groups_tokens_as_it_fills():
    env = simpy.Environment()
    group = LockstepGroup(env, group_size=2, graph_max_tokens=512)
    seen, asked = {}, []

    def price(name):
        def f(group):
            asked.append((name, group.experts))
            return group.experts / 1000.0   # a step that grows with the experts' tokens
        return f

    def rank(name, tokens):
        seen[name] = yield from group.step(tokens / 1000.0 * 2, tokens, price(name))

    env.process(rank("chunk", 2048))
    env.process(rank("decodes", 40))
    env.run()
    # both ranks priced once, over the round's sum, 2,088 (not 2 x 2,048: a step past the graph is not padded)
    assert sorted(asked) == [("chunk", 2088), ("decodes", 2088)]
    assert seen["chunk"] == seen["decodes"] == (0.0, pytest.approx(2.088))
    # a rank joining a round already priced prices it again, with its tokens added
    env = simpy.Environment()
    group, asked = LockstepGroup(env, group_size=4, graph_max_tokens=512), []

    def late(tokens, delay_events):
        for _ in range(delay_events):   # still at t = 0, after the round was priced
            yield env.timeout(0)
        yield from group.step(0.0, tokens, price("late"))

    env.process(rank("chunk", 2048))
    env.process(late(40, 3))
    env.run()
    assert asked == [("chunk", 2051), ("chunk", 2090), ("late", 2090)]
    assert seen["chunk"] == (0.0, pytest.approx(2.09))


def test_a_dp_rank_priced_with_its_groups_tokens(tmp_path):
    from costmodels.roofline import RooflineCostModel
    cfg = resolve_point({"model": "Qwen/Qwen3-30B-A3B", "hardware": "h100-sxm", "data_parallel_size": 2,
                         "enable_expert_parallel": True, "cluster": {"num_replicas": 2},
                         "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate_per_s": 1},
                                      "prompt_tokens": {"dist": "fixed", "value": 8},
                                      "output_tokens": {"dist": "fixed", "value": 8}}})
    cm = RooflineCostModel(cfg.model, cfg.gpu, deployment=cfg.deployment)
    prefill, decode = [(2048, 0)], [600] * 8
    own = cm.step_time_s(prefill, decode)
    # the ranks alike (this rank's tokens x DP, the other rank's share exchanged) is what step_time_s
    # prices: the same step, bitwise
    assert cm.step_time_in_dp_group_s(GroupTokens(2 * 2056, 2056), prefill, decode) == own
    # beside an idle rank, the experts run over the chunk and one dummy token: cheaper
    assert cm.step_time_in_dp_group_s(GroupTokens(2057, 2056), prefill, decode) < own
    # at DP 4 with three idle ranks the exchange carries this rank's share and two dummy tokens, not 3 x it
    dp4 = RooflineCostModel(cfg.model, cfg.gpu, deployment=dataclasses.replace(cfg.deployment, data_parallel_size=4))
    alike4 = dp4.step_time_s(prefill, decode)
    alone = dp4.step_time_in_dp_group_s(GroupTokens(2059, 2058), prefill, decode)
    experts_only = dp4.step_time_in_dp_group_s(GroupTokens(2059, 3 * 2056), prefill, decode)
    assert alone < experts_only < alike4
    dense = RooflineCostModel(cfg.model, cfg.gpu, deployment=dataclasses.replace(cfg.deployment, data_parallel_size=1))
    assert dense.step_time_in_dp_group_s(GroupTokens(10, 5), prefill, decode) == dense.step_time_s(prefill, decode)
