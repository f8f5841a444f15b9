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
is not priced. Not modelled: the padding of every rank to the largest rank's token count under CUDA graphs
(it makes the experts' input the same size on every rank, which the cost model's alike-ranks pricing
assumes anyway).
"""
from __future__ import annotations

import simpy


class LockstepGroup:
    """One DP group's rounds: the ranks' steps that start together end together."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.start_s: float | None = None   # the round in flight: when it started,
        self.end_s = 0.0                    # when it ends (the latest member's step so far),
        self.done: simpy.Event | None = None   # and the event that ends it

    def step(self, duration_s: float):
        """SimPy generator for a rank's step of `duration_s` on its own: joins the round starting now (or,
        if one started earlier is in flight, the next, once it ends); returns (start_s, end_s) of the
        step as the group ran it."""
        env = self.env
        while self.done is not None and self.start_s < env.now:   # a round that started before: wait it out
            yield self.done
        if self.done is None:
            self.start_s, self.end_s, self.done = env.now, env.now, env.event()
            env.process(self._end_round(self.done))
        start_s, done = self.start_s, self.done
        self.end_s = max(self.end_s, start_s + duration_s)
        yield done
        return start_s, done.value

    def _end_round(self, done: simpy.Event):
        env = self.env
        while env.now < self.end_s:   # members joining at the same instant may push the end later
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
    for g in range(0, len(engines), group_size):
        group = LockstepGroup(env)
        for e in engines[g:g + group_size]:
            e.lockstep = group
