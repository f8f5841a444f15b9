"""`hardware:` as a catalog name, a mapping of datasheet figures, or a YAML/JSON file of them; bad figures
are one line naming the key (exit 2 from experiments.run)."""
from __future__ import annotations

import json

import pytest
import yaml

from costmodels.catalog import GPUS, get_gpu
from experiments.config import ConfigError, resolve_point
from experiments.run import main

POINT = {"model": "llama-3.1-8b", "engine": {"policy": "chunked_prefill"},
         "workload": {"num_requests": 4, "arrival": {"process": "poisson", "rate_per_s": 2},
                      "prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 4}}}
RTX4090 = {"name": "my-4090", "memory_bytes": 25250627584, "hbm_bytes_per_s": "1008e9",
           "dense_flops_per_s": {"bf16": 165.2e12, "fp8": 330.3e12}, "interconnect_bytes_per_s": 32e9,
           "interconnect_kind": "pcie", "host_link_bytes_per_s": 25e9, "l2_bytes": 72e6}


def test_catalog_has_the_gpus_people_serve_on():
    for name in ("rtx-4090", "rtx-pro-6000", "l40", "a10g", "h20", "h100-pcie", "h100-nvl", "gb200", "mi300x",
                 "mi325x"):
        g = get_gpu(name)
        assert g.memory_bytes > 0 and g.hbm_bytes_per_s > 0 and g.bf16_flops_per_s > 0
    # memory as CUDA reports it: vLLM sizes its KV pool from that figure
    assert get_gpu("rtx-4090").memory_bytes == 25_250_627_584
    assert get_gpu("h100-sxm").memory_bytes == pytest.approx(85.0e9)
    assert get_gpu("RTX4090") is GPUS["rtx-4090"]   # a common spelling


def test_a_mapping_describes_a_gpu_and_is_recorded(tmp_path):
    cfg = resolve_point({**POINT, "hardware": RTX4090})
    g = cfg.gpu
    assert (g.name, g.memory_bytes, g.hbm_bytes_per_s, g.fp8_flops_per_s) == ("my-4090", 25250627584, 1008e9, 330.3e12)
    assert g.interconnect_kind == "pcie" and g.l2_bytes == 72e6
    # the same figures as the catalog entry price the same steps
    assert g.peak_flops_per_s("bf16") == get_gpu("rtx-4090").peak_flops_per_s("bf16")
    out = tmp_path / "out"
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "hw", **POINT, "hardware": RTX4090}))
    assert main([str(sweep), "--out", str(out)]) == 0
    resolved = json.loads(next(out.rglob("resolved.json")).read_text()) if list(out.rglob("resolved.json")) else None
    text = "".join(p.read_text() for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".yaml"))
    assert "my-4090" in text and ("25250627584" in text or "25250627584.0" in text), resolved


def test_a_file_and_a_base_gpu(tmp_path):
    f = tmp_path / "gpu.yaml"
    f.write_text("base: l40s\nname: l40s-24g\nmemory_bytes: 24e9\n")
    g = resolve_point({**POINT, "hardware": str(f)}).gpu
    assert (g.name, g.memory_bytes, g.hbm_bytes_per_s) == ("l40s-24g", 24e9, get_gpu("l40s").hbm_bytes_per_s)
    j = tmp_path / "gpu.json"
    j.write_text(json.dumps(RTX4090))
    assert resolve_point({**POINT, "hardware": str(j)}).gpu.memory_bytes == 25250627584


def test_gemm_compute_is_the_gpus_own_measured_share():
    """A GPU's measured GEMM compute share prices its compute-bound GEMMs; a base keeps it unless its bf16 peak
    is replaced (the share was of the base's own peak), and a mapping may give one."""
    from costmodels.catalog import get_model
    from costmodels.roofline import Efficiencies, RooflineCostModel
    l40s = get_gpu("l40s")
    assert (l40s.gemm_compute, l40s.gemm_ridge_exponent) == (0.64, 2.6) and get_gpu("a10g").gemm_compute is None
    model = RooflineCostModel(get_model("llama-3.1-8b"), l40s)
    compute_s, _ = model.gemm_sides_s(4096, 14336, 4096)
    assert compute_s == pytest.approx(2 * 4096 * 14336 * 4096 / (362e12 * 0.64))
    pooled = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a10g"))
    assert pooled.gemm_sides_s(4096, 14336, 4096)[0] == pytest.approx(
        2 * 4096 * 14336 * 4096 / (70e12 * Efficiencies().gemm_compute))
    assert resolve_point({**POINT, "hardware": {"base": "l40s", "name": "x"}}).gpu.gemm_compute == 0.64
    derated = {"base": "l40s", "name": "x", "dense_flops_per_s": {"bf16": 300e12}}
    assert resolve_point({**POINT, "hardware": derated}).gpu.gemm_compute is None
    assert resolve_point({**POINT, "hardware": {**derated, "gemm_compute": 0.7}}).gpu.gemm_compute == 0.7
    slower = resolve_point({**POINT, "hardware": {"base": "l40s", "name": "x", "hbm_bytes_per_s": 700e9}}).gpu
    assert (slower.gemm_compute, slower.gemm_ridge_exponent) == (None, None)
    assert resolve_point({**POINT, "hardware": {**RTX4090, "gemm_ridge_exponent": 2}}).gpu.gemm_ridge_exponent == 2
    # near the ridge the GPU's own exponent: an A100's GEMMs overlap loads and MMAs worse than an H100's
    a100 = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"))
    compute_s, memory_s = a100.gemm_sides_s(166, 14336, 4096)
    assert a100._gemm_s(166, 14336, 4096) == pytest.approx(
        (compute_s ** 1.15 + memory_s ** 1.15) ** (1 / 1.15) + Efficiencies().gemm_fixed_s)


@pytest.mark.parametrize("hardware, names", [
    ({**RTX4090, "memory_bytes": -1}, "hardware.memory_bytes"),
    ({**RTX4090, "memory_bytes": 0}, "hardware.memory_bytes"),
    ({k: v for k, v in RTX4090.items() if k != "hbm_bytes_per_s"}, "hardware.hbm_bytes_per_s"),
    ({**RTX4090, "dense_flops_per_s": {"int3": 1e12}}, "hardware.dense_flops_per_s.int3"),
    ({**RTX4090, "dense_flops_per_s": {"fp8": 1e12}}, "hardware.dense_flops_per_s.bf16"),
    ({**RTX4090, "dense_flops_per_s": {"bf16": "fast"}}, "hardware.dense_flops_per_s.bf16"),
    ({**RTX4090, "interconnect_kind": "ethernet"}, "hardware.interconnect_kind"),
    ({**RTX4090, "colour": "green"}, "hardware.colour"),
    ({**RTX4090, "gemm_compute": 1.2}, "hardware.gemm_compute"),
    ({**RTX4090, "gemm_compute": 0}, "hardware.gemm_compute"),
    ({**RTX4090, "gemm_ridge_exponent": -1}, "hardware.gemm_ridge_exponent"),
    ({**RTX4090, "sm_count": 0}, "hardware.sm_count"),
    ({**RTX4090, "sm_count": 127.5}, "hardware.sm_count"),
    ({"base": "h900"}, "hardware.base"),
    ("h900", "hardware"),
    ("/nonexistent/gpu.yaml", "hardware"),
    (7, "hardware"),
])
def test_bad_gpu_is_one_line_naming_the_key(hardware, names):
    with pytest.raises(ConfigError) as e:
        resolve_point({**POINT, "hardware": hardware})
    assert str(e.value).startswith(names) and "\n" not in str(e.value)


def test_bad_gpu_and_a_model_that_does_not_fit_exit_2(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "hw", **POINT, "hardware": {**RTX4090, "memory_bytes": -5}}))
    assert main([str(sweep), "--out", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hardware.memory_bytes" in err[0]
    # Llama-3-70B in bf16 (141 GB) on one described 24 GB card
    sweep.write_text(yaml.safe_dump({"name": "hw", **POINT, "model": "llama-3-70b", "hardware": RTX4090}))
    assert main([str(sweep), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]


def test_the_hardware_page_lists_each_gpus_measured_gemm_figures():
    """docs/hardware.md's catalog table shows what each GPU's GEMMs rest on: its own figures, or the pooled."""
    import re
    from pathlib import Path
    from costmodels.roofline import Efficiencies
    e = Efficiencies()
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(
        r"^\| `([a-z0-9-]+)`.*\| ([^|]+) \|$", (Path(__file__).parents[1] / "docs" / "hardware.md").read_text(), re.M)}
    for name, g in GPUS.items():
        if g.gemm_compute is None and g.gemm_ridge_exponent is None:
            expected = f"- ({e.gemm_compute:.2f} / {e.gemm_ridge_exponent:g})"
        else:   # a figure the GPU lacks is the pooled one, in brackets
            share = f"{g.gemm_compute:.2f}" if g.gemm_compute is not None else f"- ({e.gemm_compute:.2f})"
            ridge = f"{g.gemm_ridge_exponent:g}" if g.gemm_ridge_exponent is not None else f"- ({e.gemm_ridge_exponent:g})"
            expected = f"{share} / {ridge}"
        assert rows[name] == expected, name
