"""Property tests over random small workloads and every policy: the engine's invariants hold (it checks
them every iteration), every request ends, output counts are exact, and runs are reproducible."""
import numpy as np
import pandas as pd
import pytest

from policies import ChunkedPrefill, Continuous, Static
from simcore.costmodel import ConstantCost
from simcore.request import RequestSpec, Status
from tests.helpers import policy_id, run_engine
from workloads.synthetic import Arrival, Workload, generate
from workloads.distributions import parse_length_dist

POLICIES = [
    Static(max_num_seqs=4),
    Static(max_num_seqs=8, batch_timeout_s=0.05),
    Continuous(max_num_seqs=6, max_num_batched_tokens=512),
    Continuous(max_num_seqs=6, max_num_batched_tokens=512, kv_reservation="max"),
    Continuous(max_num_seqs=6, max_num_batched_tokens=512, mix_prefill_decode=True),
    ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64),
    ChunkedPrefill(max_num_seqs=16, max_num_batched_tokens=128, long_prefill_token_threshold=32),
]


def random_specs(seed):
    rng = np.random.default_rng(seed)
    wl = Workload(int(rng.integers(5, 40)), Arrival("poisson", rate_per_s=float(rng.uniform(5, 200))),
                  parse_length_dist({"dist": "lognormal", "median": float(rng.uniform(8, 100)), "sigma": 1.0, "max": 600}, "p"),
                  parse_length_dist({"dist": "exponential", "mean": float(rng.uniform(2, 40)), "max": 200}, "o"))
    specs = generate(wl, seed, max_model_len=512).specs
    # plus one request beyond max_model_len, which must be rejected with a reason
    return specs + (RequestSpec(len(specs), specs[-1].arrival_s / 2, 500, 100),)


@pytest.mark.parametrize("policy", POLICIES, ids=policy_id)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_every_request_ends_exactly_and_kv_stays_in_bounds(policy, mode):
    for seed in range(6):
        specs = random_specs(seed)
        num_blocks = 40  # 640 tokens of KV: tight enough to force preemptions and some rejections
        df, log, engine = run_engine(policy, specs, cost=ConstantCost(0.01, 1e-4), num_gpu_blocks=num_blocks,
                                     block_size=16, max_model_len=512, preemption_mode=mode, num_swap_blocks=20)
        assert len(df) == len(specs)
        assert set(df.status) <= {"finished", "rejected"}
        assert df.loc[df.status == "rejected", "reject_reason"].notna().all()
        for r in engine.requests.values():
            if r.status is Status.FINISHED:
                assert r.num_generated_tokens == r.spec.num_output_tokens
                assert r.first_token_s <= r.finish_s
            else:
                assert r.status is Status.REJECTED
        assert max(it[9] for it in log.iterations) <= num_blocks
        assert engine.pool.num_used_blocks == 0 and engine.swap_space.num_used_blocks == 0


def test_preemptions_and_rejections_do_happen_in_the_property_workloads():
    total_pre = total_rej = 0
    for seed in range(6):
        df, *_ = run_engine(ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64), random_specs(seed),
                            cost=ConstantCost(0.01, 1e-4), num_gpu_blocks=40, max_model_len=512)
        total_pre += df.num_preemptions.sum()
        total_rej += (df.status == "rejected").sum()
    assert total_pre > 0 and total_rej > 0


@pytest.mark.parametrize("policy", POLICIES[::2], ids=lambda p: p.name)
def test_same_seed_gives_identical_frames(policy):
    a, *_ = run_engine(policy, random_specs(3), cost=ConstantCost(0.01, 1e-4), num_gpu_blocks=40, max_model_len=512)
    b, *_ = run_engine(policy, random_specs(3), cost=ConstantCost(0.01, 1e-4), num_gpu_blocks=40, max_model_len=512)
    pd.testing.assert_frame_equal(a, b)
