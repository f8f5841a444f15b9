"""The real backend: its forward equals a dense causal reference, and it generates exactly the greedy
tokens of that reference under every policy's batching (chunks, mixed batches, padding, preemption)."""
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import simpy  # noqa: E402

from fidelity.torch_backend import BackendError, RealBackend  # noqa: E402
from fidelity.torch_llama import (Decoder, PagedKVCache, SeqGroup, StepInput, random_weights,  # noqa: E402
                               reference_logits)
from costmodels.catalog import get_model  # noqa: E402
from policies import POLICIES, ChunkedPrefill, Continuous, Static  # noqa: E402
from simcore.costmodel import ConstantCost  # noqa: E402
from simcore.engine import Engine, EngineLimits  # noqa: E402
from simcore.request import RequestSpec  # noqa: E402

SHAPE = dataclasses.replace(get_model("tiny"), num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                            intermediate_size=96, vocab_size=97, max_model_len=128)


def _t(a):
    return torch.tensor(a, dtype=torch.long)


def test_paged_varlen_attention_equals_dense_causal_reference():
    weights = random_weights(SHAPE, seed=1)
    decoder = Decoder(weights)
    bs = 4
    cache = PagedKVCache(SHAPE, num_blocks=8, block_size=bs, device="cpu", dtype=torch.float32)
    rng = np.random.default_rng(0)
    a = rng.integers(1, 97, size=12).tolist()   # sequence A in blocks 5, 2, 7 (scattered)
    b = rng.integers(1, 97, size=6).tolist()    # sequence B in blocks 0, 3
    slots_a = [blk * bs + i for blk in (5, 2, 7) for i in range(bs)]
    slots_b = [blk * bs + i for blk in (0, 3) for i in range(bs)]
    ref_a, ref_b = reference_logits(weights, _t(a)), reference_logits(weights, _t(b))
    # step 1: A's first chunk (7 tokens) and all of B's prompt (5 tokens) in one pass
    step1 = StepInput(_t(a[:7] + b[:5]), _t(list(range(7)) + list(range(5))), _t(slots_a[:7] + slots_b[:5]),
                      [SeqGroup(7, 7, _t([list(range(7))]), _t([slots_a[:7]])),
                       SeqGroup(5, 5, _t([list(range(7, 12))]), _t([slots_b[:5]]))], _t([11]))
    torch.testing.assert_close(decoder.logits(step1, cache)[0], ref_b[4], rtol=1e-4, atol=1e-4)
    # step 2: A's second chunk (4 tokens over 7 cached) mixed with B's decode (1 token over 5 cached)
    step2 = StepInput(_t(a[7:11] + b[5:6]), _t(list(range(7, 11)) + [5]), _t(slots_a[7:11] + slots_b[5:6]),
                      [SeqGroup(4, 11, _t([list(range(4))]), _t([slots_a[:11]])),
                       SeqGroup(1, 6, _t([[4]]), _t([slots_b[:6]]))], _t([0, 1, 2, 3, 4]))
    out = decoder.logits(step2, cache)
    torch.testing.assert_close(out[:4], ref_a[7:11], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[4], ref_b[5], rtol=1e-4, atol=1e-4)
    # step 3: A's decode at position 11
    step3 = StepInput(_t(a[11:12]), _t([11]), _t(slots_a[11:12]),
                      [SeqGroup(1, 12, _t([[0]]), _t([slots_a[:12]]))], _t([0]))
    torch.testing.assert_close(decoder.logits(step3, cache)[0], ref_a[11], rtol=1e-4, atol=1e-4)


def _greedy_reference(weights, prompt, num_new):
    seq = list(prompt)
    for _ in range(num_new):
        seq.append(int(reference_logits(weights, _t(seq))[-1].argmax()))
    return seq[len(prompt):]


def _run(policy, specs, num_blocks=64, block_size=4, **backend_options):
    backend = RealBackend(SHAPE, num_blocks, block_size, "cpu", seed=3, reference_every_s=1e9, **backend_options)
    env = simpy.Environment()
    limits = EngineLimits(num_gpu_blocks=num_blocks, block_size=block_size, max_model_len=SHAPE.max_model_len)
    engine = Engine(env, policy, ConstantCost(), limits, executor=backend)
    for s in specs:
        engine.submit(s)
    env.run()
    assert all(r.finish_s is not None for r in engine.requests.values())
    return backend, engine


SPECS = [RequestSpec(0, 0.0, 9, 5, 8), RequestSpec(1, 0.0, 14, 3, 8), RequestSpec(2, 0.0, 5, 6, 8)]


@pytest.mark.parametrize("policy", [ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=8),
                                    Continuous(max_num_seqs=2, max_num_batched_tokens=64),
                                    *(POLICIES[name]() for name in ("tgi", "trtllm", "sglang") if name in POLICIES)],
                        ids=lambda p: p.name)
def test_generation_equals_greedy_reference(policy):
    backend, engine = _run(policy, SPECS)
    for spec in SPECS:
        prompt = backend.outputs[spec.request_id][:spec.num_prompt_tokens]
        got = backend.outputs[spec.request_id][spec.num_prompt_tokens:]
        assert got == _greedy_reference(backend.decoder.w, prompt, spec.num_output_tokens)
    kinds = {r.kind for r in backend.records}
    if isinstance(policy, ChunkedPrefill):
        assert "mixed" in kinds  # chunks and decodes shared a forward pass


def test_batched_decode_attention_generates_the_same_tokens():
    policy = ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=8)
    per_seq, _ = _run(policy, SPECS, decode_attention="per_seq")
    batched, _ = _run(policy, SPECS, decode_attention="batched")
    assert batched.outputs == per_seq.outputs
    for spec in SPECS:
        prompt = batched.outputs[spec.request_id][:spec.num_prompt_tokens]
        assert (batched.outputs[spec.request_id][spec.num_prompt_tokens:]
                == _greedy_reference(batched.decoder.w, prompt, spec.num_output_tokens))


def test_static_batch_pads_prompts_and_keeps_finished_rows():
    backend, engine = _run(Static(max_num_seqs=3), SPECS)
    padded_len = max(s.num_prompt_tokens for s in SPECS)
    for spec in SPECS:
        toks = backend.outputs[spec.request_id]
        prompt = toks[:spec.num_prompt_tokens]
        padded = [0] * (padded_len - len(prompt)) + prompt
        assert toks[spec.num_prompt_tokens:] == _greedy_reference(backend.decoder.w, padded, spec.num_output_tokens)
    # every step runs all three rows until the longest output ends
    assert [r.num_seqs for r in backend.records] == [3] * max(s.num_output_tokens for s in SPECS)
    assert all(r.is_padded for r in backend.records)


def test_recompute_preemption_regenerates_the_same_tokens():
    # 9 blocks of 4 tokens cannot hold all three requests at their peak (12 blocks): the engine preempts
    specs = [RequestSpec(0, 0.0, 9, 12, 16), RequestSpec(1, 0.0, 14, 10, 16), RequestSpec(2, 0.0, 5, 12, 16)]
    backend, engine = _run(ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=32), specs, num_blocks=9)
    assert sum(r.num_preemptions for r in engine.requests.values()) > 0
    for spec in specs:
        prompt = backend.outputs[spec.request_id][:spec.num_prompt_tokens]
        assert (backend.outputs[spec.request_id][spec.num_prompt_tokens:]
                == _greedy_reference(backend.decoder.w, prompt, spec.num_output_tokens))


def test_records_match_engine_iterations_and_measure_time():
    backend, engine = _run(ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=8), SPECS)
    its = engine.log.iterations
    assert len(backend.records) == len(its) == len(backend.cost_args)
    assert [r.measured_s for r in backend.records] == [row[1] for row in its]
    assert all(r.forward_s > 0 and np.isfinite(r.measured_s) for r in backend.records)


def test_speed_normalised_steps_repeat_idempotently_and_advance_by_normalised_time():
    policy = ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=8)
    plain, _ = _run(policy, SPECS)
    backend, engine = _run(policy, SPECS, speed_normalise=True, step_repeats=3)
    assert backend.outputs == plain.outputs  # re-running a step writes the same K/V and samples the same tokens
    records = backend.records
    assert [r.normalised_s for r in records] == [row[1] for row in engine.log.iterations]
    assert all(r.normalised_s > 0 and r.measured_s > 0 and r.speed_ratio > 0 for r in records)


def test_more_physical_blocks_than_counted_fails_loudly():
    backend = RealBackend(SHAPE, 2, 4, "cpu", reference_every_s=1e9)
    env = simpy.Environment()
    # the engine counts 4 usable blocks (5 less the null block) but only 2 exist physically
    engine = Engine(env, ChunkedPrefill(max_num_batched_tokens=16), ConstantCost(),
                    EngineLimits(num_gpu_blocks=5, block_size=4, max_model_len=64), executor=backend)
    engine.submit(RequestSpec(0, 0.0, 14, 2))
    with pytest.raises(BackendError, match="physical KV exhausted"):
        env.run()


def test_speed_probe_leaves_the_engine_cache_alone():
    backend = RealBackend(SHAPE, 8, 4, "cpu", reference_every_s=1e9)
    before = [k.clone() for k in backend.cache.k]
    assert backend.reference_s(reps=1) > 0
    assert all(torch.equal(a, b) for a, b in zip(before, backend.cache.k))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_generation_equals_greedy_reference():
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32, so greedy choices match the reference
    backend = RealBackend(SHAPE, 64, 4, "cuda", dtype="fp32", seed=3, reference_every_s=1e9)
    env = simpy.Environment()
    engine = Engine(env, ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=8), ConstantCost(),
                    EngineLimits(num_gpu_blocks=64, block_size=4, max_model_len=128), executor=backend)
    for s in SPECS:
        engine.submit(s)
    env.run()
    for spec in SPECS:
        toks = backend.outputs[spec.request_id]
        prompt = toks[:spec.num_prompt_tokens]
        assert toks[spec.num_prompt_tokens:] == _greedy_reference(backend.decoder.w, prompt, spec.num_output_tokens)
