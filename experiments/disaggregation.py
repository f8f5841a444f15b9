"""Wiring a `disaggregation:` point (simcore/disagg.py) and adding its per-role columns to the tables.

The requests table gains `prefill_replica_id`, `decode_replica_id` (NaN when the request never reached the
decode pool: rejected, or done after one token), `kv_wait_s` (prefill done -> transfer start: decode-side
KV and link queueing) and `kv_transfer_s`; the iterations and replicas tables a `role` column.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from experiments.answer_basis import router_basis_column
from simcore.disagg import HANDOFF_COLUMNS, DisaggregatedCluster, KVLink
from simcore.engine import Engine, EngineLimits
from simcore.fast.disagg import FastDisagg
from simcore.metrics import replicas_frame


def build(env, cfg, cost_model, limits: EngineLimits, log, kv_bytes_per_token: int) -> DisaggregatedCluster:
    d = cfg.disaggregation
    prefill_limits = dataclasses.replace(limits, handoff_after_first_token=True)
    prefill = [Engine(env, cfg.policy, cost_model, prefill_limits, log, replica_id=i)
               for i in range(d.num_prefill_replicas)]
    decode = [Engine(env, cfg.policy, cost_model, limits, log, replica_id=d.num_prefill_replicas + i)
              for i in range(d.num_decode_replicas)]
    link = KVLink(d.link_bandwidth_gb_per_s * 1e9, d.link_latency_s)
    return DisaggregatedCluster(env, prefill, decode, d.router, d.decode_router, link, kv_bytes_per_token,
                                d.first_token_from, getattr(cfg.policy, "max_num_seqs", None))


def build_fast(cfg, cost_model, limits: EngineLimits, specs, closed) -> FastDisagg:
    """The same deployment on the fast path (simcore/fast/disagg.py), with the same arguments as `build`."""
    d = cfg.disaggregation
    link = KVLink(d.link_bandwidth_gb_per_s * 1e9, d.link_latency_s)
    return FastDisagg(cfg.policy, cost_model, limits, specs, d.num_prefill_replicas, d.num_decode_replicas,
                      d.router, d.decode_router, link, limits.kv_bytes_per_token, d.first_token_from,
                      getattr(cfg.policy, "max_num_seqs", None), closed=closed)


def role_of(replica_id, num_prefill: int) -> str:
    return "prefill" if replica_id < num_prefill else "decode"


def add_handoff_columns(requests: pd.DataFrame, cluster: DisaggregatedCluster) -> pd.DataFrame:
    h = pd.DataFrame.from_records(cluster.handoffs, columns=list(HANDOFF_COLUMNS))
    h["kv_wait_s"] = h["kv_transfer_start_s"] - h["prefill_done_s"]
    h["kv_transfer_s"] = h["kv_transfer_end_s"] - h["kv_transfer_start_s"]
    out = requests.merge(h[["request_id", "prefill_replica_id", "decode_replica_id", "kv_wait_s", "kv_transfer_s",
                            "kv_transfer_bytes"]], on="request_id", how="left")
    num_prefill = len(cluster.prefill)
    prefill_only = out["prefill_replica_id"].isna()  # never handed off: it stayed where it was logged
    out.loc[prefill_only, "prefill_replica_id"] = out.loc[prefill_only, "replica_id"]
    out["prefill_replica_id"] = out["prefill_replica_id"].astype(int)
    out["role"] = [role_of(r, num_prefill) for r in out["replica_id"]]
    return out


def replicas_by_role(requests: pd.DataFrame, iterations: pd.DataFrame, num_gpu_blocks: int,
                     num_prefill: int, num_decode: int) -> pd.DataFrame:
    """One row per replica: prefill replicas count the requests they prefilled, decode replicas those they
    decoded (latency columns as seen by those requests)."""
    n = num_prefill + num_decode
    by_prefill = replicas_frame(requests.assign(replica_id=requests["prefill_replica_id"]), iterations,
                                num_gpu_blocks, n)
    by_decode = replicas_frame(requests, iterations, num_gpu_blocks, n)
    out = pd.concat([by_prefill.iloc[:num_prefill], by_decode.iloc[num_prefill:]], ignore_index=True)
    out.insert(1, "role", [role_of(r, num_prefill) for r in out["replica_id"]])
    return out


def summary_keys(requests: pd.DataFrame, replicas: pd.DataFrame, cluster: DisaggregatedCluster, cfg) -> dict:
    d = cfg.disaggregation
    moved = requests["kv_transfer_s"].notna()
    busy = replicas.groupby("role")["busy_fraction"].mean()
    return {"num_replicas": len(replicas), "num_prefill_replicas": d.num_prefill_replicas,
            "num_decode_replicas": d.num_decode_replicas, "router": d.router.name, **router_basis_column(d.router),
            "decode_router": d.decode_router.name, "first_token_from": d.first_token_from,
            "num_kv_transfers": int(moved.sum()),
            "kv_transfer_mean_ms": float(requests.loc[moved, "kv_transfer_s"].mean() * 1e3) if moved.any() else 0.0,
            "kv_wait_p99_ms": float(requests.loc[moved, "kv_wait_s"].quantile(0.99) * 1e3) if moved.any() else 0.0,
            "prefill_busy_fraction": float(busy.get("prefill", 0.0)),
            "decode_busy_fraction": float(busy.get("decode", 0.0)),
            "busy_fraction": float(replicas["busy_fraction"].mean()),
            "kv_usage_max": float(replicas["kv_usage_max"].max())}


def resolved_keys(cfg) -> dict:
    d = cfg.disaggregation
    return {"disaggregation": {**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)},
                               "router": d.router.name, "decode_router": d.decode_router.name}}
