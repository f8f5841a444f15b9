"""The sweep file's `autoscaling:` section (simcore/autoscaler.py):

  autoscaling: {min_replicas: 1, max_replicas: 8, signal: waiting_per_replica, scale_up_above: 4,
                scale_down_below: 0.5, startup_s: 60, interval_s: 15, cooldown_s: 60, gpu_price_per_hour: 2.5}

The replicas sit behind `cluster.router` (round robin without a cluster section); the autoscaler decides how
many serve, so `cluster.num_replicas` is not set with it. `startup_s` defaults to the time to copy one
replica's weights over the host link (a lower bound: container start, disk reads and CUDA graph capture add
to it; set it from a measured cold start)."""
from __future__ import annotations

from experiments.configcheck import ConfigError, check_keys, number
from simcore.autoscaler import SIGNALS, AutoscalingLimits

REQUIRED = ("min_replicas", "max_replicas", "signal", "scale_up_above", "scale_down_below")
OPTIONAL = ("startup_s", "interval_s", "cooldown_s", "window_s", "gpu_price_per_hour")


def parse_autoscaling(spec, cluster_spec) -> dict | None:
    """The section checked, as a mapping of its values (startup_s None when it is to be derived)."""
    if spec is None:
        return None
    check_keys("autoscaling", spec, set(REQUIRED) | set(OPTIONAL))
    for k in REQUIRED:
        if k not in spec:
            raise ConfigError(f"autoscaling.{k}: required")
    if isinstance(cluster_spec, dict) and "num_replicas" in cluster_spec:
        raise ConfigError("cluster.num_replicas: not used with autoscaling (min_replicas..max_replicas decide)")
    if spec["signal"] not in SIGNALS:
        raise ConfigError(f"autoscaling.signal: expected one of {', '.join(SIGNALS)}, got {spec['signal']!r}")
    out = {"signal": spec["signal"]}
    for k in ("min_replicas", "max_replicas"):
        out[k] = number(f"autoscaling.{k}", spec[k], minimum=1, integer=True)
    if out["max_replicas"] < out["min_replicas"]:
        raise ConfigError(f"autoscaling.max_replicas: {out['max_replicas']} is below min_replicas {out['min_replicas']}")
    for k in ("scale_up_above", "scale_down_below"):
        out[k] = number(f"autoscaling.{k}", spec[k])
    if out["scale_down_below"] >= out["scale_up_above"]:
        raise ConfigError("autoscaling.scale_down_below: must be below scale_up_above (else it flaps)")
    for k in ("interval_s", "cooldown_s", "window_s"):
        if k in spec:
            out[k] = number(f"autoscaling.{k}", spec[k], strict=k != "cooldown_s")
    out["startup_s"] = number("autoscaling.startup_s", spec["startup_s"]) if "startup_s" in spec else None
    out["gpu_price_per_hour"] = (number("autoscaling.gpu_price_per_hour", spec["gpu_price_per_hour"])
                                 if "gpu_price_per_hour" in spec else None)
    return out


def autoscaling_limits(values: dict, weight_bytes: float, host_link_bytes_per_s: float) -> AutoscalingLimits:
    """The limits, with the default start-up: one GPU's weight bytes over its host link."""
    kw = {k: v for k, v in values.items() if k != "gpu_price_per_hour" and v is not None}
    kw.setdefault("startup_s", weight_bytes / host_link_bytes_per_s)
    return AutoscalingLimits(**kw)
