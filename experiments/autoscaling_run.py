"""Wiring an autoscaled cluster into a point's run (simcore/autoscaler.py) and its results-row keys: GPU-hours,
replicas over time, scaling actions, cost, and SLO attainment per hour of arrivals."""
from __future__ import annotations

import pandas as pd

from costmodels import deployment as _deployment
from costmodels.deployment import Deployment
from experiments.autoscaling_config import autoscaling_limits
from policies.routers import RoundRobin
from simcore.autoscaler import AutoscaledCluster, Autoscaling, AutoscalingLimits


def scaling_limits(cfg) -> AutoscalingLimits:
    """The point's autoscaling limits, its start-up derived from the model's weights where not set."""
    d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
    return autoscaling_limits(cfg.autoscaling, _deployment.weight_bytes_per_gpu(cfg.model, d),
                              cfg.gpu.host_link_bytes_per_s)


def scaling_router(cfg):
    """The router in front of the autoscaled replicas: the cluster section's, else round robin."""
    return cfg.cluster.router if cfg.cluster is not None else RoundRobin()


def autoscaled_cluster(cfg, engines, num_requests: int) -> AutoscaledCluster:
    """The SimPy engine's autoscaled cluster of `engines` (the fast path's: simcore/fast/autoscaling.py)."""
    return AutoscaledCluster(engines, scaling_router(cfg), scaling_limits(cfg), num_requests)


def autoscaling_keys(scaler: Autoscaling, requests: pd.DataFrame, gpu_price_per_hour: float | None,
                     gpus_per_replica: int) -> dict:
    """`gpu_hours` (every GPU of every replica from its start to its leaving), `replicas_mean` (over the
    scaler's span), `replicas_peak`, `num_scale_ups` / `num_scale_downs`, `startup_s`, `replica_timeline`
    ('time:replicas ...'), `cost` with a price, and with an SLO `slo_attainment_by_hour` ('hour:share ...',
    by arrival hour)."""
    timeline = scaler.replica_timeline()
    span_s = max(scaler.end_s, 1e-9)
    replica_s = sum(scaler.gpu_s)
    out = {"gpu_hours": replica_s * gpus_per_replica / 3600, "replicas_mean": replica_s / span_s,
           "replicas_peak": max(n for _, n in timeline),
           "num_scale_ups": sum(e.kind == "start" for e in scaler.events),
           "num_scale_downs": sum(e.kind == "drain" for e in scaler.events),
           "startup_s": scaler.limits.startup_s,
           "replica_timeline": " ".join(f"{t:g}:{n}" for t, n in timeline)}
    if gpu_price_per_hour is not None:
        out["cost"] = out["gpu_hours"] * gpu_price_per_hour
    if "meets_slo" in requests:
        hour = (requests["arrival_s"].to_numpy(float) // 3600).astype(int)
        by_hour = pd.Series(requests["meets_slo"].to_numpy(bool)).groupby(hour).mean()
        out["slo_attainment_by_hour"] = " ".join(f"{h}:{v:.3f}" for h, v in by_hour.items())
    return out
