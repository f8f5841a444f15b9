"""The TP all-reduce's price by what it crosses: `latency + ring bytes / (link x efficiency)` per call,
with the latency and the efficiency of the path the collective actually takes between the GPUs.

The interconnect kinds (`GPU.interconnect_kind`, a catalog entry's or the user's `hardware:` mapping):

- `nvlink`: NVLink / NVSwitch, by TP size (`NVLINK`). vLLM picks the all-reduce by message size and TP size
  (vllm/distributed/device_communicators/all_reduce_utils.py, 0.15-0.32): on Hopper its custom all-reduce
  (captured in the CUDA graphs) up to 64 MiB at TP 2, 32 MiB at TP 4 and 256 KiB at TP 8, PyTorch's
  symmetric-memory multimem all-reduce at TP 6-8 up to 64 MiB (NVSwitch's multicast, NVLS, reduces in the
  switch: fewer bytes per GPU than a ring), NCCL beyond. Other NVLink GPUs without NVLS keep the TP 4
  figure at TP 6-8. The A100's NVLink 3 has its own (`NVLINK_AMPERE`): custom up to 8 MiB at every TP size,
  then NCCL.
- `infinity_fabric`: AMD MI300X/MI325X's xGMI mesh. No sourced ROCm all-reduce table was found, so it keeps
  the NVLink figures without multicast (a fully connected mesh of point-to-point links, as NVSwitch is to
  the GPUs).
- `pcie`: PCIe with GPU peer-to-peer (P2P) access: data centre and workstation cards (L4, L40S, A10G,
  RTX PRO 6000, H100 PCIe without its bridge) on a host whose IOMMU and PCIe ACS let P2P traffic go from
  GPU to GPU. vLLM runs its custom all-reduce at TP 2 on such a pair below its 8 MiB buffer (the SM 8.x and
  12.x parts have no entry in `CUSTOM_ALL_REDUCE_MAX_SIZES`, so the default size holds) and NCCL above it
  and at TP > 2 (custom_all_reduce.py: "not supported on more than two PCIe-only GPUs"). The custom kernel
  moves the same ring bytes as NCCL at about NCCL's rate, but one kernel reading the peer's buffer starts in
  about 4 us where NCCL's ring protocol takes 13-20 (`PCIE_CUSTOM_TP2`).
- `pcie_host`: PCIe without P2P: each GPU's data is staged through host memory (NCCL's SHM transport).
  NVIDIA disables P2P on GeForce cards (RTX 4090), and the Linux kernel turns PCIe ACS on whenever the
  IOMMU is on, which sends peer traffic up to the root complex; vLLM then finds no P2P (`_can_p2p`) and
  disables its custom all-reduce, so every all-reduce is NCCL's through the host.

Every figure is fitted the same way: least squares on relative error of
`latency + ring bytes / bandwidth` over messages of 256 kB to 64 MB, CUDA-graph-captured timings; the
efficiency is that bandwidth over the catalog's per-direction link figure (docs/sources.md, "TP
collectives over PCIe").
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkCollective:
    """Latency per all-reduce call, and the fraction of `GPU.interconnect_bytes_per_s` its ring bytes move at;
    messages of `beyond_bytes` and more take `beyond`'s figures (where the engine hands them to another
    algorithm)."""
    efficiency: float
    latency_s: float
    beyond_bytes: float = float("inf")
    beyond: LinkCollective | None = None


MiB = 1024 * 1024


# NVLink / NVSwitch, by TP size: vLLM 0.24's all-reduce under CUDA graphs in aiconfigurator's H100 tables (through
# vLLM's own dispatch, above), fitted over 256 kB-64 MB (`python -m benchmarks.kernel_efficiency`, 1-4% median
# error): 0.50 + 3.9 us at TP 2, 0.59 + 6.6 us at TP 4 (vLLM 0.19's table 0.61: 0.60 here), 0.78 + 9.5 us at TP 8;
# the H200's 0.52 / 0.62 / 0.83, vLLM 0.19's H100 0.50 / 0.61 / 0.78. vLLM 0.14's H100 table is slower at TP 8
# (0.64 + 11.6 us; docs/fidelity/gpu/README.md item 18 says why). Beyond the custom kernel's
# and symmetric memory's limits (64 MiB at TP 2 and 8, 32 MiB at TP 4: a chunk of 4,096+ tokens of an 8,192-wide
# model) vLLM runs NCCL, which the same tables time at 0.77 + 103 us, 0.79 + 50 us and 1.05 + 93 us (H200 0.75,
# 0.79, 1.07) of the ring figure (over 1 at TP 8: NCCL's NVLS algorithm reduces in the switch and moves fewer
# bytes than a ring); at the limit the two figures price a message within 2% of each other and of the table.
NVLINK = {2: LinkCollective(0.50, 3.9e-6, 64 * MiB, LinkCollective(0.77, 103e-6)),
          4: LinkCollective(0.60, 6.6e-6, 32 * MiB, LinkCollective(0.79, 50e-6)),
          8: LinkCollective(0.78, 9.5e-6, 64 * MiB, LinkCollective(1.05, 93e-6))}
# NVLink 3 on Ampere (A100), by TP size: vLLM's dispatch differs there. SM 8.0 has no entry in
# `CUSTOM_ALL_REDUCE_MAX_SIZES` and no symmetric-memory path (all_reduce_utils.py lists 9.0 and 10.x), so the
# custom kernel runs below its default 8 MiB buffer at every TP size and NCCL above it. aiconfigurator's A100
# table (vLLM 0.14, through vLLM's dispatch under CUDA graphs), fitted as above on each side of 8 MiB: 0.70 +
# 5.4 us, 0.60 + 8.7 us and 0.86 + 15.1 us below; 0.65 + 45 us, 0.73 + 62 us and 0.74 + 70 us from 8 MiB
# (`python -m benchmarks.kernel_efficiency`). Against Hopper's figures on the A100's link a 1 MB decode
# message at TP 4 takes 17.0 us, not 14.9, and a 2,048-token chunk of an 8,192-wide model (32 MiB) 292 us,
# not 262.
NVLINK_AMPERE = {2: LinkCollective(0.70, 5.4e-6, 8 * MiB, LinkCollective(0.65, 45e-6)),
                 4: LinkCollective(0.60, 8.7e-6, 8 * MiB, LinkCollective(0.73, 62e-6)),
                 8: LinkCollective(0.86, 15.1e-6, 8 * MiB, LinkCollective(0.74, 70e-6))}
# NCCL over PCIe with P2P, by GPU count. 2: the median of three NCCL tables, each a pair of GPUs on one host
# under CUDA graphs: aiconfigurator's RTX PRO 6000 Server (NCCL 2.29.2) 0.559 of 64 GB/s + 12.9 us, its L40S
# (NCCL 2.27.3) 0.632 of 32 GB/s + 19.6 us, LLMServingSim's two RTX PRO 6000 Server with ACS and IOMMU off
# (vLLM's PyNcclCommunicator) 0.588 + 14.2 us. 4 and 8: aiconfigurator's RTX PRO 6000 Server (the only PCIe
# table with all three sizes): the GPUs' rings share the root complex's and switches' uplinks, 0.415 + 29.8
# us and 0.394 + 73.5 us.
PCIE_P2P_NCCL = {2: LinkCollective(0.59, 14.2e-6), 4: LinkCollective(0.415, 29.8e-6),
                 8: LinkCollective(0.394, 73.5e-6)}
# vLLM's own TP 2 all-reduce over PCIe with P2P, through its dispatch under CUDA graphs (aiconfigurator's vLLM
# custom_allreduce tables, backend vllm_graph, messages of 256 kB to 8 MiB): L40S (vLLM 0.14 and 0.22, one
# measurement) 0.581 of 32 GB/s + 3.9 us, RTX PRO 6000 Server (vLLM 0.24) 0.645 of 64 GB/s + 4.8 us; their
# mean. Above 8 MiB the same tables time NCCL (0.59 + 8 us, 0.57 + 15 us): `PCIE_P2P_NCCL[2]`. vLLM 0.19's RTX
# PRO 6000 Server table is a host without P2P (0.24 + 22 us, the custom kernel refused: `PCIE_HOST`'s regime).
# `python -m benchmarks.pcie_collectives`.
PCIE_CUSTOM_TP2 = LinkCollective(0.61, 4.4e-6, 8 * MiB, PCIE_P2P_NCCL[2])
# PCIe through host memory: LLMServingSim's calibration of two RTX PRO 6000 Server (PCIe 5.0 x16) before their
# host's ACS and IOMMU were turned off: 16.1 GB/s = 0.252 of 64 GB/s + 9.5 us (10 kB: 16.2 us). P2P-disabled
# copies between two RTX 5090 at PCIe 5.0 x8 reach 15 GB/s each way when both directions run, and P2P-off
# latency is about 14 us against 0.4 us with P2P (rtx6kpro's measurements), the same regime. TP > 2: no
# measurement; the TP 2 figures.
PCIE_HOST = LinkCollective(0.252, 9.5e-6)


def allreduce_link(kind: str, tp: int, multicast: bool = False, ampere: bool = False) -> LinkCollective:
    """The latency and efficiency of one all-reduce across `tp` GPUs over an interconnect of `kind`;
    `multicast`: the NVLink switch reduces in the fabric (NVLS: Hopper and later, `nvls_multicast`);
    `ampere`: NVLink 3 GPUs, where vLLM dispatches by other limits (`NVLINK_AMPERE`, `nvlink_ampere`)."""
    if kind == "pcie":
        return PCIE_CUSTOM_TP2 if tp <= 2 else collective_link(kind, tp)   # NCCL at TP > 2
    if kind == "pcie_host":
        return PCIE_HOST
    size = max(k for k in NVLINK if k <= max(tp, 2))   # nvlink, infinity_fabric
    if kind == "nvlink" and ampere:
        return NVLINK_AMPERE[size]
    return NVLINK[4 if size == 8 and not multicast else size]


def gpu_allreduce_link(gpu, tp: int) -> LinkCollective:
    """`allreduce_link` for `tp` GPUs of kind `gpu` (catalog.GPU): its interconnect, NVLS and NVLink 3."""
    return allreduce_link(gpu.interconnect_kind, tp, nvls_multicast(gpu), nvlink_ampere(gpu))


def collective_link(kind: str, gpus: int) -> LinkCollective:
    """NCCL's other collectives among `gpus` GPUs (EP's all-gathers and reduce-scatters, one GPU's send to
    another): over PCIe NCCL's all-reduce figures (its own tables; vLLM's custom kernel is an all-reduce
    only); over NVLink the TP 4 all-reduce's, which NCCL's all-reduce reaches there too (0.60 of the link in
    aiconfigurator's H100 NCCL 2.27 table)."""
    if kind == "pcie":
        return PCIE_P2P_NCCL[max(k for k in PCIE_P2P_NCCL if k <= max(gpus, 2))]
    return PCIE_HOST if kind == "pcie_host" else NVLINK[4]


def nvlink_ampere(gpu) -> bool:
    """Whether the GPUs are NVLink 3 Ampere parts (compute capability 8.x over NVLink: the A100)."""
    cc = gpu.compute_capability
    return gpu.interconnect_kind == "nvlink" and cc is not None and cc.split(".")[0] == "8"


def nvls_multicast(gpu) -> bool:
    """Whether the GPUs' NVLink switch reduces in the fabric (NVLS multicast: NVSwitch 3 with Hopper, compute
    capability 9.0, and later), which vLLM's multimem all-reduce uses at TP 6-8."""
    return gpu.interconnect_kind == "nvlink" and gpu.compute_capability is not None and float(gpu.compute_capability) >= 9.0


def ring_allgather_s(share_bytes: float, gpus: int, link_bytes_per_s: float, link: LinkCollective) -> float:
    """One ring all-gather of `share_bytes` from each of `gpus` GPUs: each receives the other gpus - 1 shares
    (half an all-reduce's ring: a ring all-reduce is a reduce-scatter then an all-gather)."""
    if gpus <= 1:
        return 0.0
    return (gpus - 1) * share_bytes / (link_bytes_per_s * link.efficiency) + link.latency_s


def logits_gather_s(num_logits: int, vocab_size: int, tp: int, dtype_bytes: float, gpu) -> float:
    """Under TP each GPU's LM head computes its shard of the vocabulary, and vLLM all-gathers the shards, in
    the model's dtype, before sampling (`LogitsProcessor._gather_logits`: an all-gather on every CUDA
    platform, vLLM 0.15 through 0.32; run after the model's CUDA graph, through NCCL), so a step moves
    num_logits x vocab / TP x (TP - 1) bytes into each GPU, at NCCL's figures for what the TP group crosses
    (`collective_link`): at TP 2 over PCIe without P2P, 128 sequences of a 151,936-token vocabulary, 19.4 MB
    and about 1.2 ms; over NVLink tens of microseconds. No kernel table times it, so every cost model adds
    this term."""
    if tp <= 1 or not num_logits:
        return 0.0
    share = num_logits * math.ceil(vocab_size / tp) * dtype_bytes
    return ring_allgather_s(share, tp, gpu.interconnect_bytes_per_s, collective_link(gpu.interconnect_kind, tp))


def ring_allreduce_s(message_bytes: float, tp: int, link_bytes_per_s: float, link: LinkCollective) -> float:
    """One ring all-reduce of `message_bytes` per GPU: each GPU sends and receives 2 (tp - 1) / tp of it."""
    if tp <= 1:
        return 0.0
    if message_bytes >= link.beyond_bytes:
        link = link.beyond
    ring = message_bytes * 2 * (tp - 1) / tp
    return ring / (link_bytes_per_s * link.efficiency) + link.latency_s
