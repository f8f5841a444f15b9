"""The PCIe all-reduce figures of costmodels/collectives.py, refitted from NVIDIA aiconfigurator's tables.

    python -m benchmarks.pcie_collectives

For each PCIe GPU whose aiconfigurator-core package ships an NCCL table (`systems/data/<gpu>/comm/nccl/
<version>/nccl_perf.parquet`: RTX PRO 6000 Server, L40S), and each TP size, it fits `latency + ring bytes /
bandwidth` to the bf16 all-reduce rows of 256 kB to 64 MB (least squares on relative error, as the NVLink
figure was fitted) and prints the latency, the bandwidth, its fraction of the catalog's per-direction link
and the worst relative error. Then the same fit of vLLM's own TP 2 all-reduce through its dispatch under CUDA
graphs (`comm/vllm/<version>/custom_allreduce_perf.parquet`, backend `vllm_graph`), below its custom kernel's
8 MiB buffer and above it (NCCL's). Without the `[aic]` extra it says so and exits 0.
"""
from __future__ import annotations

import sys

import numpy as np

# catalog name -> aiconfigurator's folder; the link is the catalog's interconnect_bytes_per_s
TABLES = {"rtx-pro-6000-server": "rtx_pro_6000_server", "l40s": "l40s"}


def fit(ring_bytes, seconds, lo: float = 256e3, hi: float = 64e6) -> tuple[float, float, float]:
    """(latency s, bandwidth B/s, worst relative error) of `latency + ring_bytes / bandwidth` over the rows
    between `lo` and `hi` ring bytes."""
    b, t = np.asarray(ring_bytes, float), np.asarray(seconds, float)
    m = (b >= lo) & (b <= hi)
    a = np.stack([np.ones(m.sum()), b[m]], 1) / t[m, None]
    (latency, inv_bw), *_ = np.linalg.lstsq(a, np.ones(m.sum()), rcond=None)
    worst = float(np.abs((latency + inv_bw * b[m]) / t[m] - 1).max())
    return float(latency), float(1 / inv_bw), worst


def main(argv=None) -> int:
    import pandas as pd

    from commandline.parser import Parser
    from costmodels.aic import tables_root
    from costmodels.catalog import GPUS
    from costmodels.collectives import PCIE_CUSTOM_TP2
    Parser(prog="python -m benchmarks.pcie_collectives", description=__doc__.split("\n\n")[0]).parse_args(argv)
    root = tables_root()
    if root is None:
        print("aiconfigurator-core is not installed (the [aic] extra): nothing to fit")
        return 0
    for name, folder in TABLES.items():
        for path in sorted((root / folder / "comm" / "nccl").glob("*/nccl_perf.parquet")):
            t = pd.read_parquet(path)
            # message_size counts elements (aiconfigurator's collector); half = 2 bytes each
            t = t[(t["op_name"] == "all_reduce") & (t["nccl_dtype"] == "half")]
            link = GPUS[name].interconnect_bytes_per_s
            for tp, g in t.groupby("num_gpus"):
                ring = g["message_size"].to_numpy() * 2.0 * 2 * (tp - 1) / tp
                latency, bw, worst = fit(ring, g["latency"].to_numpy() * 1e-3)   # the table's latency is ms
                print(f"{name} NCCL {path.parent.name} TP{tp}: {latency * 1e6:.1f} us + ring bytes at "
                      f"{bw / 1e9:.1f} GB/s = {bw / link:.3f} of {link / 1e9:.0f} GB/s (worst {worst:.1%})")
    buffer = PCIE_CUSTOM_TP2.beyond_bytes   # vLLM's custom all-reduce buffer (costmodels/collectives.py)
    for name, folder in TABLES.items():
        for path in sorted((root / folder / "comm" / "vllm").glob("*/custom_allreduce_perf.parquet")):
            t = pd.read_parquet(path)
            t = t[(t["backend"] == "vllm_graph") & (t["num_gpus"] == 2)]
            link = GPUS[name].interconnect_bytes_per_s
            ring = t["message_size"].to_numpy() * 2.0   # TP 2: the ring moves the message once each way
            for what, lo, hi in (("below 8 MiB", 256e3, buffer - 1), ("8 MiB and more", buffer, 64e6)):
                latency, bw, worst = fit(ring, t["latency"].to_numpy() * 1e-3, lo, hi)
                print(f"{name} vLLM {path.parent.name} all-reduce (graph) TP2, {what}: {latency * 1e6:.1f} us + "
                      f"ring bytes at {bw / 1e9:.1f} GB/s = {bw / link:.3f} of {link / 1e9:.0f} GB/s "
                      f"(worst {worst:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
