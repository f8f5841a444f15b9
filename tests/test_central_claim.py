"""The central claim for continuous batching (Anyscale 2023; Orca; vLLM): on heavy-tailed outputs it
delivers well over twice the throughput of static batching at equal memory; with equal output lengths the
two come out close. Saturated runs: every request arrives at t = 0."""
import pytest

from experiments.simulate import simulate


def throughput(policy, output_tokens):
    cfg = dict(model="llama-3-8b", hardware="h100-sxm", profile="roofline",
               engine=dict(policy=policy, max_num_seqs=128),
               workload=dict(num_requests=384, arrival=dict(process="poisson", rate_per_s=float("inf")),
                             prompt_tokens=dict(dist="fixed", value=512), output_tokens=output_tokens))
    return simulate(cfg).summary["output_tok_per_s"]


def test_continuous_more_than_doubles_static_on_heavy_tailed_outputs():
    heavy = dict(dist="lognormal", median=128, sigma=1.0, max=1024)
    assert throughput("continuous", heavy) > 2.0 * throughput("static", heavy)
    assert throughput("chunked_prefill", heavy) > 2.0 * throughput("static", heavy)


def test_static_and_continuous_come_out_close_with_equal_output_lengths():
    fixed = dict(dist="fixed", value=256)
    assert throughput("continuous", fixed) == pytest.approx(throughput("static", fixed), rel=0.1)
