"""The data-parallel ranks of an MoE model step together.

With data parallelism the experts of an MoE model span every DP rank (vLLM's EP, or its DP attention with
the experts sharded over DP x TP), and each MoE layer joins the ranks in a collective: the all-gather of
every rank's tokens before the experts and the reduce-scatter after (costmodels/roofline.py
`_alltoall_s`). No rank can run a layer ahead of the others, so the ranks run their forward passes in
lockstep: vLLM's DP engine cores agree on every step (`coordinate_batch_across_dp`,
vllm/v1/worker/dp_utils.py, an all-reduce of each rank's token count before the forward), a rank with
nothing to run runs a dummy batch to take part (`execute_dummy_batch`), and a step ends for all when the
slowest rank's ends. SGLang's DP attention synchronises its ranks' forward passes the same way.

`LockstepGroup` is that coupling for the SimPy replicas of one DP group (simcore/engine.py): a rank whose
step starts at the same instant as the group's round joins it, and every member's step ends at the round's
end, the latest of the members' own step times; a rank that becomes ready while a round is in flight
waits for it to end and starts the next. An idle rank's dummy batch (one token) is never the slowest, so it
is not priced.

What each rank's experts run over is the group's, not the rank's: the all-gather hands every rank all the
ranks' tokens. How many, vLLM decides per step (`_synchronize_dp_ranks`, vllm/v1/worker/dp_utils.py): while
every rank runs its step under a CUDA graph, each is padded to the largest rank's token count, dummy
batches too, so the experts see DP x the largest; once one rank's step is too big for a graph (a long
prefill chunk) none is padded, and they see the ranks' sum. `group_tokens` is that rule (and what the
exchange before and after the experts then carries); a round prices each rank whose cost model can
(`step_time_in_dp_group_s`) with the round's figures once its ranks have joined.
"""
from __future__ import annotations

from typing import NamedTuple

import simpy


# vLLM's largest CUDA graph, in tokens, unless a user sets it: min(2 x max_num_seqs, 512), and no more than
# the token budget (vllm/config/vllm.py `_set_cudagraph_sizes`, 0.11-0.32; 0.32 makes it 1,024 on compute
# capability 10.x, after the versions the prior represents). A step with more tokens runs without one.
CUDA_GRAPH_MAX_TOKENS = 512


def cuda_graph_max_tokens(max_num_seqs: int | None, max_num_batched_tokens: int | None) -> int:
    """The largest step vLLM runs under a CUDA graph for these engine limits (either may be unknown)."""
    limit = CUDA_GRAPH_MAX_TOKENS
    if max_num_seqs:
        limit = min(limit, 2 * max_num_seqs)
    if max_num_batched_tokens:
        limit = min(limit, max_num_batched_tokens)
    return limit


class GroupTokens(NamedTuple):
    """What a DP group's step moves: `experts`, the tokens each rank's experts run over; `exchanged`, the
    tokens the all-gather and the reduce-scatter carry across the busiest GPU's link."""
    experts: int
    exchanged: int


def group_tokens(rank_tokens: list[int], group_size: int, graph_max_tokens: int) -> GroupTokens:
    """The tokens of a step whose busy ranks carry `rank_tokens` (the other ranks of the group run a
    one-token dummy batch). While all run under a CUDA graph every rank is padded to the largest
    (vllm/v1/worker/dp_utils.py `_synchronize_dp_ranks`): the experts see DP x the largest, and each GPU
    receives the other DP - 1 ranks' share. Past the graph nobody is padded: the experts see the ranks' sum,
    and a ring's busiest link carries every rank's share but one, the smallest (`all_gatherv`,
    `reduce_scatterv`)."""
    largest = max(rank_tokens)
    if largest <= graph_max_tokens:
        return GroupTokens(group_size * largest, (group_size - 1) * largest)
    sizes = list(rank_tokens) + [1] * (group_size - len(rank_tokens))
    return GroupTokens(sum(sizes), sum(sizes) - min(sizes))


class LockstepGroup:
    """One DP group's rounds: the ranks' steps that start together end together."""

    def __init__(self, env: simpy.Environment, group_size: int = 2, graph_max_tokens: int = CUDA_GRAPH_MAX_TOKENS):
        self.env, self.group_size, self.graph_max_tokens = env, group_size, graph_max_tokens
        self.start_s: float | None = None   # the round in flight: when it started,
        self.end_s = 0.0                    # when it ends (the latest member's step so far),
        self.done: simpy.Event | None = None   # and the event that ends it
        self.members: list[tuple[int, float, object]] = []   # (tokens, own duration, price) of its ranks
        self.priced = False                 # whether the round's end has been worked out from its members

    def step(self, duration_s: float, num_tokens: int = 0, price=None):
        """SimPy generator for a rank's step of `duration_s` on its own: joins the round starting now (or,
        if one started earlier is in flight, the next, once it ends); returns (start_s, end_s) of the
        step as the group ran it. `price(group)`, where given, is the rank's step in the round's
        (`group_tokens` of the `num_tokens` of its ranks), and `duration_s` is then not read."""
        env = self.env
        while self.done is not None and self.start_s < env.now:   # a round that started before: wait it out
            yield self.done
        if self.done is None:
            self.start_s, self.end_s, self.done, self.members, self.priced = env.now, env.now, env.event(), [], False
            env.process(self._end_round(self.done))
        start_s, done = self.start_s, self.done
        self.members.append((num_tokens, duration_s, price))
        if self.priced:   # joined after the round was priced: again, with this rank's tokens (it only adds)
            self._price()
        yield done
        return start_s, done.value

    def _price(self) -> None:
        """The round's end from its members: each one's step with its experts over the round's tokens (or its
        own duration where it has no price), the longest."""
        members = self.members
        if any(p is not None for _, _, p in members):
            tokens = group_tokens([n for n, _, _ in members], self.group_size, self.graph_max_tokens)
            longest = max(d if p is None else p(tokens) for _, d, p in members)
        else:
            longest = max(d for _, d, _ in members)
        self.end_s = max(self.end_s, self.start_s + longest)
        self.priced = True

    def _end_round(self, done: simpy.Event):
        env = self.env
        # the ranks that start this round with the one that opened it (all woken by the last round's end)
        # have joined by now: price the round once
        self._price()
        while env.now < self.end_s:   # members joining later in the same instant may push the end later
            yield env.timeout(self.end_s - env.now)
        self.done = None
        done.succeed(env.now)


def dp_group_size(is_moe: bool, data_parallel_size: int) -> int:
    """Replicas that step together: the DP ranks of an MoE model (1: every replica on its own)."""
    return data_parallel_size if is_moe and data_parallel_size > 1 else 1


def lockstep_groups(env: simpy.Environment, engines, group_size: int) -> None:
    """Join consecutive replicas into DP groups of `group_size` (the cluster holds whole groups). A lone
    replica stands for one rank of the group, the others taken alike: it steps on its own."""
    if group_size < 2 or len(engines) < 2:
        return
    policy = engines[0].policy
    graph_max = cuda_graph_max_tokens(getattr(policy, "max_num_seqs", None),
                                      getattr(policy, "max_num_batched_tokens", None))
    for g in range(0, len(engines), group_size):
        group = LockstepGroup(env, group_size, graph_max)
        for e in engines[g:g + group_size]:
            e.lockstep = group
