"""What policies and cost models see of the fast engine (simcore/fast/): its lazy decoders through the view's
`LazyProgress`, never the engine; a cost model's context-sum pricing through the stated protocol."""
from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost, ContextSumPricing
from simcore.fast.decoders import LazyDecoders
from simcore.fast.engine import FastEngine
from simcore.limits import EngineLimits
from simcore.request import RequestSpec
from tests.test_fastpath import ROOFLINE


def test_cost_models_offer_sum_pricing_through_the_protocol():
    assert isinstance(ROOFLINE, ContextSumPricing)
    assert not isinstance(ConstantCost(), ContextSumPricing)
    assert FastEngine(ChunkedPrefill(), ROOFLINE, EngineLimits(100), []).pricer.by_sums
    assert not FastEngine(ChunkedPrefill(), ConstantCost(), EngineLimits(100), []).pricer.by_sums


def test_the_shortcut_view_holds_the_decoders_not_the_engine():
    specs = [RequestSpec(i, 0.01 * i, 40, 30) for i in range(6)]
    policy = ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=64)
    engine = FastEngine(policy, ConstantCost(0.01), EngineLimits(64), specs)
    seen = []
    shortcut = engine.shortcut

    def spy(view):
        seen.append((view.decoders, view.num_decode_growth_blocks(), view.all_running_decoding(),
                     [view.num_generated_tokens(r) for r in view.running]))
        return shortcut(view)
    engine.shortcut = spy
    log = engine.simulate()
    assert seen and (log.status == 1).all()
    for decoders, growth, all_decoding, generated in seen:
        assert isinstance(decoders, LazyDecoders) and decoders is engine.decoders
        assert all_decoding and growth >= 0 and all(0 < g < 30 for g in generated)
