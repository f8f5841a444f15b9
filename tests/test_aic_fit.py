"""The fitted terms of the table grids (costmodels/tablegrid.py): L2-capacity step, latency + bandwidth
for collectives, and a held-out error whose fitted constants never see the held-out rows. Synthetic rows
only, so these run without the [aic] extra."""
import numpy as np
import pandas as pd
import pytest

from costmodels.tablegrid import baseline_s, family, fit_baseline, held_out_error, l2_jumps

L2_BYTES = 96e6
DECODE = {"flops": [], "bytes": [(4096.0, (1, 1))], "peak_flops_per_s": 1.0, "bytes_per_s": 864e9}


def decode_rows(speedup=3.0):
    """Decode-attention-like rows over (batch, context): streaming 4 KiB of KV per token at 864 GB/s,
    `speedup` times faster while the call's KV fits in a 96 MB L2, plus a 5 us launch."""
    pts = np.array([[b, s] for b in 2.0 ** np.arange(0, 9) for s in 2.0 ** np.arange(4, 17)])
    num_bytes = 4096.0 * pts[:, 0] * pts[:, 1]
    lat = 5e-6 + num_bytes / 864e9 / np.where(num_bytes <= L2_BYTES, speedup, 1.0)
    return pts, lat


def test_l2_jumps_measure_the_step_between_neighbouring_rows_only():
    pts = np.array([[1, 8], [1, 16], [1, 32], [2, 8], [2, 16]], dtype=float)
    inside = np.array([True, True, False, True, False])
    log_ratio = np.log([1.0, 1.0, 3.0, 1.0, 3.0])
    # along the context: (1,16)->(1,32), (2,8)->(2,16); along the batch: (1,16)->(2,16); (1,8)->(2,8) no
    assert l2_jumps(pts, log_ratio, inside).tolist() == pytest.approx([np.log(3)] * 3)


def test_fitted_l2_speedup_recovers_the_step_and_flattens_the_ratio():
    pts, lat = decode_rows(speedup=3.0)
    b = fit_baseline({**DECODE, "l2_bytes": L2_BYTES}, pts, lat)
    assert b["l2_speedup"] == pytest.approx(3.0, rel=0.1)
    flat = fit_baseline(DECODE, pts, lat)   # the same rows without the L2 term
    ratio = lambda bb: np.ptp(np.log(lat / baseline_s(bb, pts)))
    assert ratio(b) < 0.5 * ratio(flat)


def test_l2_term_cuts_the_held_out_error_at_the_cliff():
    pts, lat = decode_rows(speedup=3.0)
    axes, slopes = ("batch", "context"), (1.0, 1.0)
    with_l2 = held_out_error(axes, pts, lat, slopes, {**DECODE, "l2_bytes": L2_BYTES})
    without = held_out_error(axes, pts, lat, slopes, DECODE)
    assert with_l2["p90_pct"] < 5 < without["p90_pct"]


def test_latency_bandwidth_fit_of_a_collective():
    elements = 2.0 ** np.arange(8, 29)
    lat = 8e-6 + 2 * elements / 300e9
    b = fit_baseline({"flops": [], "bytes": [(2.0, (1,))], "peak_flops_per_s": 1.0, "fit": "latency_bandwidth"},
                     elements[:, None], lat)
    assert b["fixed_s"] == pytest.approx(8e-6, rel=0.02) and b["bytes_per_s"] == pytest.approx(300e9, rel=0.02)


def test_held_out_rows_do_not_enter_the_fitted_baseline():
    """Rescaling only the held-out rows moves their error by exactly that factor: nothing fitted from them."""
    pts, lat = decode_rows()
    k0, k1 = np.unique(pts[:, 0]), np.unique(pts[:, 1])
    held = np.isin(pts[:, 0], k0[1:-1][2::5]) | np.isin(pts[:, 1], k1[1:-1][2::5])
    base = {**DECODE, "l2_bytes": L2_BYTES}
    fast = lat.copy()
    fast[held] *= 0.5   # these rows twice as fast: the prediction is unchanged, so the error is ~100%
    assert fit_baseline(base, pts[~held], lat[~held]) == fit_baseline(base, pts[~held], fast[~held])
    err = held_out_error(("b", "s"), pts, fast, (1.0, 1.0), base)
    assert err["median_pct"] > 90


def test_family_keeps_the_fitted_baseline_for_pricing():
    pts, lat = decode_rows()
    rows = pd.DataFrame({"b": pts[:, 0], "s": pts[:, 1], "latency": lat * 1e3})
    f = family(rows, ("b", "s"), ("b", "s"), (1.0, 1.0), {**DECODE, "l2_bytes": L2_BYTES})
    from costmodels.tablegrid import TableFamily
    assert f["baseline"]["l2_speedup"] == pytest.approx(3.0, rel=0.1)
    assert TableFamily(f)(16, 1024) == pytest.approx(5e-6 + 4096 * 16 * 1024 / 864e9 / 3, rel=0.05)   # 67 MB: in L2
    assert TableFamily(f)(16, 4096) == pytest.approx(5e-6 + 4096 * 16 * 4096 / 864e9, rel=0.05)   # 268 MB: out


def test_per_sequence_time_is_fitted_from_the_shortest_contexts():
    pts, lat = decode_rows()
    lat = lat + 2e-7 * pts[:, 0]   # 0.2 us of each sequence's own work
    b = fit_baseline({**DECODE, "l2_bytes": L2_BYTES, "per_seq_s": 0.0}, pts, lat)
    assert b["per_seq_s"] == pytest.approx(2e-7, rel=0.3)   # it also holds the 16-token KV read and launch share
    axes, slopes = ("batch", "context"), (1.0, 1.0)
    with_seq = held_out_error(axes, pts, lat, slopes, {**DECODE, "l2_bytes": L2_BYTES, "per_seq_s": 0.0})
    assert with_seq["p90_pct"] <= held_out_error(axes, pts, lat, slopes, {**DECODE, "l2_bytes": L2_BYTES})["p90_pct"]
