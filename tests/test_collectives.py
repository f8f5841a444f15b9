"""The TP all-reduce priced by what it crosses (costmodels/collectives.py): NVLink by TP size as vLLM dispatches
it (multimem at TP 8 where the switch reduces), PCIe with peer-to-peer at NCCL's measured PCIe figures, PCIe
without it through host memory; hand-worked numbers."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from costmodels.catalog import GPUS, ModelShape
from costmodels.collectives import (NVLINK, NVLINK_AMPERE, PCIE_HOST, PCIE_P2P_NCCL, MiB, allreduce_link,
                                   collective_link, nvlink_ampere, nvls_multicast, ring_allreduce_s)
from costmodels.profile import ProfileCostModel
from costmodels.roofline import RooflineCostModel
from experiments.config import ConfigError, resolve_point
from experiments.run import main

# hidden 5120, bf16: one token's all-reduce message is 10,240 bytes
QWEN3_32B = ModelShape("qwen3-32b-like", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8,
                       intermediate_size=25600, vocab_size=151936, max_model_len=40960, head_dim=128)


def test_one_megabyte_at_tp2_by_interconnect_kind():
    mb = 1e6   # per GPU; at TP 2 the ring moves 2 x (2 - 1) / 2 = 1x of it each way
    # NVLink on an H100 (450 GB/s a direction), vLLM's custom all-reduce at TP 2: 1e6 / (450e9 x 0.50) + 3.9 us
    assert ring_allreduce_s(mb, 2, 450e9, allreduce_link("nvlink", 2, True)) == pytest.approx(8.3444e-6, rel=1e-4)
    # PCIe 5.0 x16 with P2P (64 GB/s), vLLM's custom all-reduce below 8 MiB: 1e6 / (64e9 x 0.61) + 4.4 us
    assert ring_allreduce_s(mb, 2, 64e9, allreduce_link("pcie", 2)) == pytest.approx(30.015e-6, rel=1e-4)
    # from 8 MiB vLLM hands it to NCCL: 16 MiB / (64e9 x 0.59) + 14.2 us = 444.31 + 14.2 us
    assert ring_allreduce_s(16 * MiB, 2, 64e9, allreduce_link("pcie", 2)) == pytest.approx(458.51e-6, rel=1e-4)
    # the same link through host memory: 1e6 / (64e9 x 0.252) + 9.5 us = 62.00 + 9.5 us
    assert ring_allreduce_s(mb, 2, 64e9, allreduce_link("pcie_host", 2)) == pytest.approx(71.504e-6, rel=1e-4)
    # PCIe at TP 4: the ring moves 1.5 MB each way, 1.5e6 / (64e9 x 0.415) + 29.8 us
    assert ring_allreduce_s(mb, 4, 64e9, allreduce_link("pcie", 4)) == pytest.approx(86.276e-6, rel=1e-4)
    # TP 3 takes NCCL's TP 2 figures (vLLM refuses its custom kernel on more than two PCIe GPUs), TP 16 TP 8's;
    # one GPU has nothing to reduce
    assert allreduce_link("pcie", 3) is PCIE_P2P_NCCL[2]
    assert allreduce_link("pcie", 16) == allreduce_link("pcie", 8)
    assert ring_allreduce_s(mb, 1, 64e9, allreduce_link("pcie", 1)) == 0.0
    assert allreduce_link("infinity_fabric", 8) is NVLINK[4]


def test_h100_nvlink_all_reduce_is_the_same_price_bitwise_at_tp4():
    """The formula before the interconnect kinds (TP 4: 0.60 of the link + 6.6 us), evaluated in the same order."""
    gpu = GPUS["h100-sxm"]
    cm = RooflineCostModel(QWEN3_32B, gpu, tp=4)
    for n in (1, 37, 128, 2048):
        bytes_ = n * QWEN3_32B.hidden_size * 2 * 2 * (4 - 1) / 4
        old = 2 * (bytes_ / (gpu.interconnect_bytes_per_s * 0.60) + 6.6e-6)
        assert cm.step_terms_s(decode=[700] * n)["allreduce"] == pytest.approx(QWEN3_32B.num_layers * old, rel=1e-12)
        assert cm._allreduce_s(n) == old


def test_nvlink_all_reduce_by_tp_size_and_multicast():
    """A 2,048-token step's message for a 8,192-wide model (33.5 MB) on H100s: TP 8 runs vLLM's multimem
    all-reduce (the switch reduces); A100s have no NVLS and no symmetric memory, and vLLM hands anything from
    8 MiB to NCCL there, at the A100 table's own figures."""
    message = 2048 * 8192 * 2
    h100 = GPUS["h100-sxm"]
    assert nvls_multicast(h100) and not nvls_multicast(GPUS["a100-80gb"])
    assert not nvls_multicast(GPUS["l40s"]) and not nvls_multicast(GPUS["mi300x"])
    # ring bytes 33,554,432 x 2 x 7 / 8 = 58,720,256: / (450e9 x 0.78) + 9.5 us = 167.30 + 9.5 us
    tp8 = RooflineCostModel(QWEN3_32B, h100, tp=8)
    assert ring_allreduce_s(message, 8, 450e9, tp8.tp_link) == pytest.approx(176.80e-6, rel=1e-4)
    # the same on A100s' NVLink 3 (300 GB/s a direction): past 8 MiB, NCCL at the A100 table's TP 8 figure,
    # / (300e9 x 0.74) + 70 us = 264.51 + 70 us
    a100 = RooflineCostModel(QWEN3_32B, GPUS["a100-80gb"], tp=8)
    assert a100.tp_link is NVLINK_AMPERE[8] and nvlink_ampere(GPUS["a100-40gb"]) and not nvlink_ampere(h100)
    assert ring_allreduce_s(message, 8, 300e9, a100.tp_link) == pytest.approx(334.51e-6, rel=1e-4)
    # at TP 4 a 1 MB decode message at the custom kernel's A100 figure, 1.5e6 / (300e9 x 0.60) + 8.7 us
    tp4 = allreduce_link("nvlink", 4, False, True)
    assert ring_allreduce_s(1e6, 4, 300e9, tp4) == pytest.approx(17.033e-6, rel=1e-4)
    # PCIe and AMD's fabric are not NVLink 3, whatever the flag
    assert allreduce_link("infinity_fabric", 4, False, True) is NVLINK[4]
    assert not nvlink_ampere(GPUS["a10g"]) and not nvlink_ampere(GPUS["mi300x"])
    # TP 2 at vLLM's custom kernel's own figure; TP 6 takes TP 4's, TP 16 TP 8's
    assert RooflineCostModel(QWEN3_32B, h100, tp=2).tp_link is NVLINK[2]
    assert allreduce_link("nvlink", 6, True) is NVLINK[4] and allreduce_link("nvlink", 16, True) is NVLINK[8]
    # past vLLM's custom and symmetric-memory limits NCCL takes over: at TP 4 a 4,096-token chunk's 67,108,864
    # bytes (over 32 MiB) move 100,663,296 ring bytes at 0.79 of 450 GB/s + 50 us = 283.16 + 50 us (aiconfigurator's
    # H100 table: 329.9 us); just under the limit, TP 4's own pair: 50,331,642 / (450e9 x 0.60) + 6.6 us
    assert ring_allreduce_s(2 * message, 4, 450e9, NVLINK[4]) == pytest.approx(333.16e-6, rel=1e-4)
    assert ring_allreduce_s(message - 4, 4, 450e9, NVLINK[4]) == pytest.approx(193.01e-6, rel=1e-4)
    # EP's all-gathers and reduce-scatters and PP's sends are NCCL's, at the TP 4 figure over NVLink
    assert tp8.ep_link is NVLINK[4] and tp8.p2p_link is NVLINK[4]
    assert collective_link("pcie", 4) == allreduce_link("pcie", 4)
    # over PCIe the other collectives are NCCL's at every size: vLLM's custom kernel is an all-reduce only
    assert collective_link("pcie", 2) is PCIE_P2P_NCCL[2] is allreduce_link("pcie", 2).beyond
    assert collective_link("pcie_host", 8) is PCIE_HOST


def test_a_decode_step_on_two_rtx_pro_6000_by_kind():
    """128 decoding sequences, Qwen3-32B shapes at TP 2: 128 all-reduces of 1,310,720 bytes a step."""
    def allreduce_ms(kind):
        gpu = dataclasses.replace(GPUS["rtx-pro-6000-server"], interconnect_kind=kind)
        return RooflineCostModel(QWEN3_32B, gpu, tp=2).step_terms_s(decode=[1000] * 128)["allreduce"] * 1e3
    # 128 x (1,310,720 / (64e9 x 0.61) + 4.4 us) = 128 x 37.97 us: vLLM's custom kernel (NCCL's ring protocol
    # would take 128 x 48.91 us)
    assert allreduce_ms("pcie") == pytest.approx(4.860, rel=1e-3)
    # 128 x (1,310,720 / (64e9 x 0.252) + 9.5 us) = 128 x 90.77 us
    assert allreduce_ms("pcie_host") == pytest.approx(11.619, rel=1e-3)


def test_catalog_kinds_and_the_layer_profile_use_the_same_rule():
    assert GPUS["rtx-4090"].interconnect_kind == "pcie_host"       # GeForce: no peer-to-peer
    assert GPUS["rtx-pro-6000-server"].interconnect_kind == "pcie"
    assert GPUS["l40s"].interconnect_kind == "pcie"
    assert GPUS["h100-sxm"].interconnect_kind == "nvlink"
    gpu = GPUS["rtx-pro-6000-server"]
    prior = RooflineCostModel(QWEN3_32B, gpu, tp=2)
    prof = ProfileCostModel.__new__(ProfileCostModel)   # only what _allreduce_s reads
    prof.tp, prof.gpu, prof.model, prof.dtype = 2, gpu, QWEN3_32B, "bf16"
    assert prof._allreduce_s(128) == pytest.approx(prior._allreduce_s(128), rel=1e-12)


POINT = {"model": "llama-3.1-8b", "engine": {"policy": "chunked_prefill"},
         "workload": {"num_requests": 4, "arrival": {"process": "poisson", "rate_per_s": 2},
                      "prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 4}}}


def test_a_described_gpu_takes_pcie_host_and_a_bad_kind_is_one_line(tmp_path, capsys):
    g = resolve_point({**POINT, "hardware": {"base": "rtx-pro-6000-server", "interconnect_kind": "pcie_host"}}).gpu
    assert g.interconnect_kind == "pcie_host"
    with pytest.raises(ConfigError) as e:
        resolve_point({**POINT, "hardware": {"base": "rtx-pro-6000-server", "interconnect_kind": "pcie-p2p"}})
    assert str(e.value).startswith("hardware.interconnect_kind") and "pcie_host" in str(e.value)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "hw", **POINT,
                                     "hardware": {"base": "rtx-4090", "interconnect_kind": "pcie4"}}))
    assert main([str(sweep), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hardware.interconnect_kind" in err[0]


def test_the_refit_recovers_a_latency_and_a_bandwidth():
    from benchmarks.pcie_collectives import fit
    ring = [2.0 ** k for k in range(12, 28)]   # 4 kB to 128 MB; the fit keeps 256 kB to 64 MB
    latency, bw, worst = fit(ring, [14.2e-6 + b / 37.76e9 for b in ring])
    assert latency == pytest.approx(14.2e-6, rel=1e-6) and bw == pytest.approx(37.76e9, rel=1e-6) and worst < 1e-9


def test_the_link_is_recorded_in_the_cost_model_description():
    d = RooflineCostModel(QWEN3_32B, GPUS["rtx-4090"], tp=2).describe()
    assert d["tp_link"] == {"kind": "pcie_host", "efficiency": 0.252, "latency_s": 9.5e-6}


def test_the_lm_heads_vocabulary_shards_are_all_gathered_under_tp():
    """vLLM all-gathers each TP rank's logits shard (bf16) before sampling: at TP 2 over PCIe without P2P,
    128 sequences of Qwen3-32B's 151,936-token vocabulary move 128 x 75,968 x 2 bytes into each GPU at
    LLMServingSim's host-staged figures, 19.45 MB / (64e9 x 0.252) + 9.5 us = 1.2154 ms; over an H100's
    NVLink at TP 4 a quarter-vocabulary share each from three GPUs, 3 x 128 x 37,984 x 2 / (450e9 x 0.60) +
    6.6 us = 0.1146 ms; one GPU gathers nothing."""
    from costmodels.collectives import ring_allgather_s
    host = dataclasses.replace(GPUS["rtx-pro-6000-server"], interconnect_kind="pcie_host")
    share = 128 * 75968 * 2
    assert ring_allgather_s(share, 2, 64e9, PCIE_HOST) == pytest.approx(share / (64e9 * 0.252) + 9.5e-6)
    assert RooflineCostModel(QWEN3_32B, host, tp=2)._logits_gather_s(128) == pytest.approx(1.21544e-3, rel=1e-4)
    assert RooflineCostModel(QWEN3_32B, GPUS["h100-sxm"], tp=4)._logits_gather_s(128) == pytest.approx(
        0.11465e-3, rel=1e-3)
    assert RooflineCostModel(QWEN3_32B, GPUS["h100-sxm"], tp=1)._logits_gather_s(128) == 0.0
    # a measured profile adds it the same way (no kernel table times it)
    prof = ProfileCostModel.__new__(ProfileCostModel)   # only what _logits_gather_s reads
    prof.tp, prof.gpu, prof.model, prof.dtype = 2, host, QWEN3_32B, "bf16"
    assert prof._logits_gather_s(128) == pytest.approx(1.21544e-3, rel=1e-4)
    # it is part of the step's LM head term
    two = RooflineCostModel(QWEN3_32B, host, tp=2)
    terms = two.step_terms_s(decode=[1000] * 128)
    assert terms["lm_head_sampling"] > two._logits_gather_s(128)
    assert sum(terms.values()) == pytest.approx(two.step_time_s(decode=[1000] * 128))
