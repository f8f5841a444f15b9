"""The measured profile's vectorised lookups (costmodels/gridslice.py): bitwise equal to the full grid and
to `step_time_s`, so the fast path with the default cost model still reproduces the SimPy engine."""

import numpy as np
import pytest

from costmodels import get_gpu, get_model
from costmodels.gridslice import GridSlice
from costmodels.profile import LogGrid


def random_grid(rng, num_axes: int) -> LogGrid:
    knots = [np.cumsum(rng.uniform(0.5, 3.0, size=int(rng.integers(1, 7)))) for _ in range(num_axes)]
    shape = tuple(len(k) for k in knots)
    return LogGrid(tuple(f"a{i}" for i in range(num_axes)), tuple(knots), rng.normal(-9, 2, size=shape),
                   tuple(rng.uniform(0.5, 2.0, size=num_axes)))


@pytest.mark.parametrize("num_axes", [1, 2, 3])
def test_grid_slice_equals_the_full_grid_bitwise(num_axes):
    rng = np.random.default_rng(num_axes)
    for _ in range(50):
        g = random_grid(rng, num_axes)
        leading = tuple(float(v) for v in np.exp(rng.uniform(-1, 12, size=num_axes - 1)))
        s = GridSlice(g, leading)
        xs = np.concatenate([np.exp(rng.uniform(-1, 12, size=int(rng.choice([5, 200])))), np.exp(g.log_knots[-1]), [0.0, 1e-300]])
        full = [g(*leading, x) for x in xs.tolist()]
        assert [s(x) for x in xs.tolist()] == full
        assert s.many(xs).tolist() == full


def test_grid_slice_needs_every_axis_but_the_last():
    g = random_grid(np.random.default_rng(0), 2)
    with pytest.raises(ValueError, match="fix 1 axes"):
        GridSlice(g, ())


@pytest.fixture(scope="module")
def profile():
    from costmodels.selection import load_cost_model
    try:
        return load_cost_model("llama-3-8b__h100-sxm__tp1__bf16", get_model("llama-3-8b"), get_gpu("h100-sxm"))
    except Exception as e:   # the shipped profile is data: skip cleanly without it
        pytest.skip(f"no shipped H100 profile ({e})")


def test_profile_prices_many_decode_steps_as_step_time_bitwise(profile):
    rng = np.random.default_rng(3)
    for _ in range(100):
        ctx = rng.integers(1, 9000, size=int(rng.integers(1, 600)))
        steps = np.arange(0, 3000, int(rng.integers(1, 400)))
        sums = int(ctx.sum()) + len(ctx) * steps
        one = [profile.step_time_s(decode=(ctx + j).tolist(), num_logits=len(ctx)) for j in steps.tolist()]
        fn = profile.decode_step_time_fn(len(ctx), len(ctx))
        assert profile.decode_steps_time_s(len(ctx), sums, len(ctx)).tolist() == one
        assert [fn(v) for v in sums.tolist()] == one


def test_profile_prices_prefill_attention_from_its_slices_bitwise(profile):
    """Prefill steps look attention up in a slice per sequence count: the full grid's value, bit for bit,
    inside, below and beyond its knots on both axes."""
    rng = np.random.default_rng(5)
    for _ in range(2000):
        b = float(rng.integers(1, 300)) if rng.random() < 0.9 else float(rng.integers(1, 3))
        length = float(np.exp(rng.uniform(-1.0, 12.0)))
        assert profile._prefill_slice(b).scalar(length) == profile.prefill_attn(b, length)


def test_prefill_coords_of_one_sequence_equal_the_general_sum_bitwise():
    import math

    from costmodels.profile import prefill_coords
    rng = np.random.default_rng(6)
    for n, c in zip(rng.integers(1, 20000, 5000).tolist(), rng.integers(0, 30000, 5000).tolist()):
        work = sum(x * (y + (x + 1) / 2.0) for x, y in zip([n], [c]))   # the general path's operations
        assert prefill_coords([n], [c]) == (1.0, (math.sqrt(1.0 + 8.0 * work / 1.0) - 1.0) / 2.0)


def test_profile_count_tables_equal_the_scalar_formulas_bitwise(profile):
    rng = np.random.default_rng(4)
    counts = [1, 2, 1023, 1024, 1025, 8192, *rng.integers(1, 20000, size=300).tolist()]
    assert [profile.dense_layer_s(n) for n in counts] == [profile._dense_layer_s(n) for n in counts]
    pairs = [(n, int(rng.integers(0, n + 1))) for n in counts]
    assert [profile._step_terms_s(*p) for p in pairs] == [profile._step_terms_scalar_s(*p) for p in pairs]


def test_two_axis_lookup_is_the_general_one_unrolled_bitwise():
    rng = np.random.default_rng(5)
    for _ in range(50):
        g = random_grid(rng, 2)
        pts = np.exp(rng.uniform(-1, 12, size=(300, 2))).tolist()
        pts += [[float(np.exp(x)), float(np.exp(y))] for x in g.log_knots[0] for y in g.log_knots[1]]
        assert [g(a, b) for a, b in pts] == [g._call_any(a, b) for a, b in pts]


def test_a_subclass_pricing_its_layers_its_own_way_is_not_bypassed(profile):
    from costmodels.profile import ProfileCostModel

    class Doubled(ProfileCostModel):
        def _dense_layer_s(self, num_tokens: int) -> float:
            return 2 * super()._dense_layer_s(num_tokens)

    d = Doubled(profile.profile, profile.model, profile.gpu, profile.tp, profile.dtype)
    assert d.dense_layer_s(300) == 2 * profile.dense_layer_s(300)
