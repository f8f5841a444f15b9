"""`hardware:` as a user gives it: a catalog name, a mapping of datasheet figures, or the path of a YAML or
JSON file holding that mapping. Bad figures are one-line CatalogErrors naming the key.

    hardware:
      name: my-gpu                     # optional; shown in results (default: custom-gpu)
      base: l40s                       # optional: start from a catalog GPU and override some figures
      memory_bytes: 25250627584        # what CUDA reports (torch.cuda.get_device_properties().total_memory)
      hbm_bytes_per_s: 1008e9          # datasheet memory bandwidth
      dense_flops_per_s: {bf16: 165.2e12, fp8: 330.3e12}   # dense tensor-core peaks per precision
      interconnect_bytes_per_s: 32e9   # per GPU, per direction, what TP collectives cross
      interconnect_kind: pcie          # nvlink | pcie (peer-to-peer) | pcie_host (no P2P) | infinity_fabric
      host_link_bytes_per_s: 25e9      # GPU <-> host copies
      l2_bytes: 72e6                   # last-level cache (optional)
      host_memory_bytes: 256e9         # host memory per GPU (optional; the ceiling of engine.kv_offload)
      compute_capability: "8.9"        # NVIDIA's major.minor (optional; which attention kernels vLLM picks)
      sm_count: 128                    # streaming multiprocessors (optional; with compute_capability, prefill
                                       # attention is priced tile by tile as FlashAttention runs it)
      gemm_compute: 0.64               # share of the bf16 peak large GEMMs sustain, measured (optional;
                                       # default: the catalog GPU's own, else the prior's pooled 0.79)
      gemm_ridge_exponent: 2.6         # near the ridge a GEMM takes (compute^p + memory^p)^(1/p) (optional;
                                       # default: the catalog GPU's own, else 3)
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import yaml

from costmodels.catalog import GPU, INTERCONNECT_KINDS, CatalogError, get_gpu

FIGURES = ("memory_bytes", "hbm_bytes_per_s", "interconnect_bytes_per_s", "host_link_bytes_per_s")
PRECISIONS = {"bf16": "bf16_flops_per_s", "fp16": "bf16_flops_per_s", "fp8": "fp8_flops_per_s",
              "fp4": "fp4_flops_per_s"}
KEYS = {"name", "base", "dense_flops_per_s", "interconnect_kind", "l2_bytes", "host_memory_bytes",
        "compute_capability", "gemm_compute", "gemm_ridge_exponent", "sm_count", *FIGURES, *PRECISIONS.values()}


def _positive(key: str, v) -> float:
    """A positive finite number; YAML 1.1 reads `1008e9` (no dot, no sign) as a string, so numeric strings
    are accepted."""
    if isinstance(v, str):
        try:
            v = float(v.replace("_", ""))
        except ValueError:
            raise CatalogError(f"{key}: expected a positive number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise CatalogError(f"{key}: expected a positive number, got {v!r}")
    return float(v)


def parse_gpu(spec, key: str = "hardware") -> GPU:
    """A GPU from a catalog name, a mapping of figures, or a .yaml/.yml/.json file of them."""
    if isinstance(spec, GPU):
        return spec
    if isinstance(spec, str):
        if Path(spec).suffix.lower() in (".yaml", ".yml", ".json"):
            return gpu_from_file(spec, key)
        try:
            return get_gpu(spec)
        except CatalogError as e:
            raise CatalogError(f"{key}: {e}") from None
    if not isinstance(spec, dict):
        raise CatalogError(f"{key}: expected a GPU name, a mapping of datasheet figures or a YAML/JSON file, "
                           f"got {spec!r}")
    return gpu_from_mapping(spec, key)


def gpu_from_file(path: str, key: str = "hardware") -> GPU:
    p = Path(path).expanduser()
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except FileNotFoundError:
        raise CatalogError(f"{key}: {p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as e:
        raise CatalogError(f"{key}: {p}: unreadable ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{key}: {p}: expected a mapping of datasheet figures")
    return gpu_from_mapping(data, f"{key} ({p})")


def gpu_from_mapping(spec: dict, key: str = "hardware") -> GPU:
    for k in spec:
        if k not in KEYS:
            raise CatalogError(f"{key}.{k}: unknown key; expected {', '.join(sorted(KEYS))}")
    base = None
    if "base" in spec:
        if not isinstance(spec["base"], str):
            raise CatalogError(f"{key}.base: expected a catalog GPU name, got {spec['base']!r}")
        try:
            base = get_gpu(spec["base"])
        except CatalogError as e:
            raise CatalogError(f"{key}.base: {e}") from None
    name = spec.get("name", f"{base.name}-custom" if base else "custom-gpu")
    if not isinstance(name, str) or not name.strip():
        raise CatalogError(f"{key}.name: expected a non-empty string, got {name!r}")
    values = dataclasses.asdict(base) if base else {}
    values["name"] = name
    for k in FIGURES:
        if k in spec:
            values[k] = _positive(f"{key}.{k}", spec[k])
        elif k not in values:
            raise CatalogError(f"{key}.{k}: required (or give base: a catalog GPU to start from)")
    flops = spec.get("dense_flops_per_s", {})
    if not isinstance(flops, dict):
        raise CatalogError(f"{key}.dense_flops_per_s: expected a mapping of precision to FLOP/s, "
                           f"e.g. {{bf16: 989e12, fp8: 1979e12}}")
    for p, v in flops.items():
        if p not in PRECISIONS:
            raise CatalogError(f"{key}.dense_flops_per_s.{p}: unknown precision; expected {', '.join(PRECISIONS)}")
        values[PRECISIONS[p]] = _positive(f"{key}.dense_flops_per_s.{p}", v)
    for field in ("bf16_flops_per_s", "fp8_flops_per_s", "fp4_flops_per_s"):
        if field in spec:
            values[field] = _positive(f"{key}.{field}", spec[field])
    if base and (values["bf16_flops_per_s"], values["hbm_bytes_per_s"]) != (base.bf16_flops_per_s,
                                                                           base.hbm_bytes_per_s):
        # the base's GEMM figures were measured against its own peak and bandwidth, not these
        values["gemm_compute"] = values["gemm_ridge_exponent"] = None
    if spec.get("gemm_compute") is not None:
        values["gemm_compute"] = _share(f"{key}.gemm_compute", spec["gemm_compute"])
    if spec.get("gemm_ridge_exponent") is not None:
        values["gemm_ridge_exponent"] = _positive(f"{key}.gemm_ridge_exponent", spec["gemm_ridge_exponent"])
    if "bf16_flops_per_s" not in values:
        raise CatalogError(f"{key}.dense_flops_per_s.bf16: required (the dense BF16/FP16 tensor-core peak)")
    kind = spec.get("interconnect_kind", values.get("interconnect_kind", "nvlink"))
    if kind not in INTERCONNECT_KINDS:
        raise CatalogError(f"{key}.interconnect_kind: expected one of {', '.join(INTERCONNECT_KINDS)}, got {kind!r}")
    values["interconnect_kind"] = kind
    if spec.get("l2_bytes") is not None:
        values["l2_bytes"] = _positive(f"{key}.l2_bytes", spec["l2_bytes"])
    if spec.get("host_memory_bytes") is not None:
        values["host_memory_bytes"] = _positive(f"{key}.host_memory_bytes", spec["host_memory_bytes"])
    if "compute_capability" in spec:
        values["compute_capability"] = _compute_capability(f"{key}.compute_capability", spec["compute_capability"])
    if spec.get("sm_count") is not None:
        values["sm_count"] = _count(f"{key}.sm_count", spec["sm_count"])
    return GPU(**values)


def _count(key: str, v) -> int:
    """A positive whole number (1, 132, "132"; not 1.5 or true)."""
    n = _positive(key, v)
    if n != int(n):
        raise CatalogError(f"{key}: expected a whole number, got {v!r}")
    return int(n)


def _share(key: str, v) -> float:
    v = _positive(key, v)
    if v > 1:
        raise CatalogError(f"{key}: expected a share of the datasheet peak, above 0 and at most 1, got {v!r}")
    return v


def _compute_capability(key: str, v) -> str | None:
    """NVIDIA's "major.minor" (8.9, "8.9", "sm_89" read as 8.9); null for a GPU that has none (AMD)."""
    if v is None:
        return None
    text = str(v).strip().lower().removeprefix("sm_").removeprefix("sm")
    if "." not in text and text.isdigit():
        # sm_89 -> 8.9, sm_120 -> 12.0; a bare major (9) -> 9.0
        text = f"{text[:-1]}.{text[-1]}" if isinstance(v, str) and len(text) >= 2 else f"{text}.0"
    major, _, minor = text.partition(".")
    if isinstance(v, bool) or not (major.isdigit() and minor.isdigit() and 1 <= int(major) <= 20):
        raise CatalogError(f"{key}: expected NVIDIA's major.minor such as 8.9 or 9.0 (null for AMD), got {v!r}")
    return f"{int(major)}.{int(minor)}"
