"""Speculative decoding with KV offload to host memory, as vLLM 0.32 runs them together: the host stores
only sampled prompt tokens' chunks (never a block holding drafts), an EAGLE head's GPU hit gives back its
last block but its host hit is whole, MTP's host hit gives back its last chunk (the drafter's KV group,
offloading/scheduler.py); hand-worked, and the fast engine bitwise equal to the SimPy engine."""
import pytest

from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.fast.engine import FastEngine
from simcore.kvoffload import HostKVPool, OffloadLimits
from simcore.request import RequestSpec
from simcore.speculative import Speculation, default_acceptance
from simcore.wiring import run_replica
from tests.test_fastpath import (assert_identical, iterations_frame, iterations_table, random_specs,
                                 requests_frame, requests_table, with_shared_prefixes)
from tests.test_kv_offload import BS, COST, KV_BYTES_PER_TOKEN, LINK, POLICY, turns


def run(method, k, outputs=(1, 1, 1)):
    spec = Speculation(method, k, (1.0,) * k)
    lim = EngineLimits(5, BS, 512, enable_prefix_caching=True, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                       host_link_bytes_per_s=LINK, kv_offload=OffloadLimits(8), speculative=spec)
    specs = [RequestSpec(s.request_id, s.arrival_s, s.num_prompt_tokens, o, prefix_block_ids=s.prefix_block_ids)
             for s, o in zip(turns(), outputs)]
    engine = run_replica(POLICY, COST, lim, specs)
    return requests_frame(engine.log).set_index("request_id"), engine


@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_an_eagle_or_ngram_host_hit_is_whole(method):
    # C's prefix left the GPU (B evicted it), the host holds A's 3 prompt blocks: all 3 load (48 tokens),
    # 15 recomputed; first token = load (3 blocks x 16 ms) + one step of 15 tokens
    df, engine = run(method, 1)   # (B's 63 tokens + a lookahead slot fill the 4 blocks: k = 1)
    host = engine.prefix_cache.host
    assert host.num_hit_tokens == 48 and host.num_blocks_loaded == 3
    assert df.loc[2, "first_token_s"] == pytest.approx(2.0 + 3 * 0.016 + 0.01 + 15 * 0.001, abs=1e-12)


def test_an_mtp_host_hit_gives_back_its_last_chunk():
    # vLLM queries one chunk past C's limit (it has none: 63 tokens hold 3 full blocks), then pops one: 2 load
    df, engine = run("mtp", 1)
    host = engine.prefix_cache.host
    assert host.num_hit_tokens == 32 and host.num_blocks_loaded == 2
    assert df.loc[2, "first_token_s"] == pytest.approx(2.0 + 2 * 0.016 + 0.01 + 31 * 0.001, abs=1e-12)


def test_the_host_stores_prompt_chunks_only_while_drafts_are_in_flight():
    # A decodes 12 tokens with a draft a step (a block of generated tokens and drafts past its prompt):
    # only its 3 prompt blocks are stored (offload_prompt_only), as without speculation
    _, engine = run("eagle3", 1, outputs=(12, 1, 1))
    assert engine.prefix_cache.host.num_chunks_stored == 3 + 3   # A's and B's prompt blocks


def test_mtp_widened_lookup_by_hand():
    host = HostKVPool(OffloadLimits(8), BS, BS * KV_BYTES_PER_TOKEN, LINK)
    hashes = list(range(100, 106))
    host.offer(0, hashes, 6, 6 * BS)
    assert host.num_hit_blocks(hashes, 0, 3) == 3
    assert host.num_hit_blocks(hashes, 0, 3, wide_blocks=4) == 3   # held past the limit: the limit stands
    assert host.num_hit_blocks(hashes, 1, 2, wide_blocks=3) == 1
    assert host.num_hit_blocks(hashes[:2] + [0] * 4, 0, 5, wide_blocks=6) == 1   # 2 held: the second popped


@pytest.mark.parametrize("method", ["eagle3", "mtp", "ngram"])
def test_speculation_with_offload_matches_on_the_fast_path(method):
    loaded = 0
    for seed in range(3):
        specs = with_shared_prefixes(random_specs(seed), seed)
        spec = Speculation(method, 2, default_acceptance(method, 2), seed)
        lim = EngineLimits(40, 16, 512, enable_prefix_caching=True, kv_offload=OffloadLimits(30),
                           kv_bytes_per_token=100_000, host_link_bytes_per_s=1e9, speculative=spec)
        policy = ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64)
        simpy_engine = run_replica(policy, ConstantCost(0.01, 1e-4), lim, specs)
        fast_engine = FastEngine(policy, ConstantCost(0.01, 1e-4), lim, specs, record_events=True)
        fast = fast_engine.simulate()
        assert fast.events == simpy_engine.log.events
        a, b = simpy_engine.prefix_cache.host, fast_engine.prefix_cache.host
        assert (a.num_hit_tokens, a.num_chunks_stored, a.keys()) == (b.num_hit_tokens, b.num_chunks_stored, b.keys())
        log = simpy_engine.log
        assert_identical((requests_frame(log), iterations_frame(log), log.itl_gaps_s),
                         (requests_table(fast), iterations_table(fast), (fast.itl_values_s, fast.itl_counts)), 40)
        loaded += a.num_hit_tokens
    assert loaded > 0


@pytest.mark.parametrize("k, loads_", [(2, True), (8, False)])
def test_a_load_leaves_room_for_its_first_verification(k, loads_):
    # vLLM admits an async load only if its hit blocks and its first spec-decode step (1 + k + lookahead
    # tokens: 5 -> 1 block, 17 -> 2 blocks) fit in the free blocks. 4 free, a 3-block host hit: k = 2 loads,
    # k = 8 waits (the prompt's 4 blocks alone would fit)
    from collections import deque
    from types import SimpleNamespace
    from simcore.kvcache import PrefixCachingBlockPool
    from simcore.kvoffload import host_loads
    from simcore.request import Request
    lim = EngineLimits(9, BS, 512, enable_prefix_caching=True, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                       host_link_bytes_per_s=LINK, kv_offload=OffloadLimits(8),
                       speculative=Speculation("eagle3", k, (0.5,) * k))
    cache = PrefixCachingBlockPool(9, BS)
    loads = host_loads(lim, cache)
    c = Request(RequestSpec(2, 0.0, 63, 4, prefix_block_ids=(1, 2, 3)))
    cache.host.offer(0, cache.block_hashes(c.spec, 3), 3, 48)
    cache.grow(Request(RequestSpec(9, 0.0, 64, 4)), 64)   # another request holds 4 of the 8 blocks
    engine = SimpleNamespace(prefix_cache=cache, waiting=deque([c]), loading=[])
    loads.before_decision(engine, 0.0)
    assert (engine.loading == [c]) is loads_ and cache.host.num_blocks_loaded == (3 if loads_ else 0)
