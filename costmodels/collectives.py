"""The TP all-reduce's price by what it crosses: `latency + ring bytes / (link x efficiency)` per call,
with the latency and the efficiency of the path the collective actually takes between the GPUs.

The interconnect kinds (`GPU.interconnect_kind`, a catalog entry's or the user's `hardware:` mapping):

- `nvlink`: NVLink / NVSwitch. vLLM runs its custom all-reduce (captured in the decode CUDA graphs) up to
  8 MiB and NCCL beyond; priced with `Efficiencies.allreduce_link` / `allreduce_latency_s`, fitted to
  aiconfigurator's H100 tables (docs/sources.md, "Roofline efficiencies").
- `infinity_fabric`: AMD MI300X/MI325X's xGMI mesh. No sourced ROCm all-reduce table was found, so it keeps
  the NVLink figures (a fully connected mesh of point-to-point links, as NVSwitch is to the GPUs).
- `pcie`: PCIe with GPU peer-to-peer (P2P) access: data centre and workstation cards (L4, L40S, A10G,
  RTX PRO 6000, H100 PCIe without its bridge) on a host whose IOMMU and PCIe ACS let P2P traffic go from
  GPU to GPU. vLLM 0.19 runs its custom all-reduce at TP 2 on such a pair and NCCL at TP > 2
  (custom_all_reduce.py: "not supported on more than two PCIe-only GPUs"). No sourced timing of vLLM's
  custom kernel over PCIe exists; both move the same ring bytes over the same link at TP 2, so NCCL's
  measured figures price both.
- `pcie_host`: PCIe without P2P: each GPU's data is staged through host memory (NCCL's SHM transport).
  NVIDIA disables P2P on GeForce cards (RTX 4090), and the Linux kernel turns PCIe ACS on whenever the
  IOMMU is on, which sends peer traffic up to the root complex; vLLM then finds no P2P (`_can_p2p`) and
  disables its custom all-reduce, so every all-reduce is NCCL's through the host.

Every figure is fitted the same way as the NVLink one: least squares on relative error of
`latency + ring bytes / bandwidth` over messages of 256 kB to 64 MB, CUDA-graph-captured timings; the
efficiency is that bandwidth over the catalog's per-direction link figure (docs/sources.md, "TP
collectives over PCIe").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkCollective:
    """Latency per all-reduce call, and the fraction of `GPU.interconnect_bytes_per_s` its ring bytes move at."""
    efficiency: float
    latency_s: float


# PCIe with P2P, by TP size. TP 2: the median of three NCCL tables, each a pair of GPUs on one host under CUDA
# graphs: aiconfigurator's RTX PRO 6000 Server (NCCL 2.29.2) 0.559 of 64 GB/s + 12.9 us, its L40S (NCCL
# 2.27.3) 0.632 of 32 GB/s + 19.6 us, LLMServingSim's two RTX PRO 6000 Server with ACS and IOMMU off (vLLM's
# PyNcclCommunicator) 0.588 + 14.2 us. TP 4 and 8: aiconfigurator's RTX PRO 6000 Server (the only PCIe table
# with all three sizes): the GPUs' rings share the root complex's and switches' uplinks, 0.415 + 29.8 us and
# 0.394 + 73.5 us.
PCIE_P2P = {2: LinkCollective(0.59, 14.2e-6), 4: LinkCollective(0.415, 29.8e-6), 8: LinkCollective(0.394, 73.5e-6)}
# PCIe through host memory: LLMServingSim's calibration of two RTX PRO 6000 Server (PCIe 5.0 x16) before their
# host's ACS and IOMMU were turned off: 16.1 GB/s = 0.252 of 64 GB/s + 9.5 us (10 kB: 16.2 us). P2P-disabled
# copies between two RTX 5090 at PCIe 5.0 x8 reach 15 GB/s each way when both directions run, and P2P-off
# latency is about 14 us against 0.4 us with P2P (rtx6kpro's measurements), the same regime. TP > 2: no
# measurement; the TP 2 figures.
PCIE_HOST = LinkCollective(0.252, 9.5e-6)


def allreduce_link(kind: str, tp: int, nvlink: LinkCollective) -> LinkCollective:
    """The latency and efficiency of one all-reduce across `tp` GPUs over an interconnect of `kind`;
    `nvlink` is the NVLink figure (the roofline's `Efficiencies`, which users may override)."""
    if kind == "pcie":
        return PCIE_P2P[max(k for k in PCIE_P2P if k <= tp)] if tp >= 2 else PCIE_P2P[2]
    if kind == "pcie_host":
        return PCIE_HOST
    return nvlink   # nvlink, infinity_fabric


def ring_allreduce_s(message_bytes: float, tp: int, link_bytes_per_s: float, link: LinkCollective) -> float:
    """One ring all-reduce of `message_bytes` per GPU: each GPU sends and receives 2 (tp - 1) / tp of it."""
    if tp <= 1:
        return 0.0
    ring = message_bytes * 2 * (tp - 1) / tp
    return ring / (link_bytes_per_s * link.efficiency) + link.latency_s
