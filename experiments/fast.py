"""Choosing and running the fast path (simcore/fast/engine.py) for one resolved point.

`engine.fast_path: auto` (default) uses it whenever it reproduces the SimPy engine exactly: any registered
policy (it runs the policy's own `schedule`, plus its optional `schedule_decodes` shortcut), either
preemption mode, prefix caching, priority scheduling, a cluster of replicas behind any router
(simcore/fast/cluster.py), prefill/decode disaggregation (simcore/fast/disagg.py), a gateway's admission
control (simcore/fast/gateway.py), autoscaling (simcore/fast/autoscaling.py); not pipeline
parallelism, and no engine feature it does not model (any engine setting it does not know left at its default). `on` insists (a configuration it cannot
run is an error); `off` always runs the SimPy engine.
"""
from __future__ import annotations


import numpy as np
import pandas as pd
from numpy.lib.mixins import NDArrayOperatorsMixin

from simcore.dp_lockstep import dp_group_size
from simcore.engine import EngineLimits, SimulationError
from experiments import disaggregation
from experiments.autoscaling_run import scaling_limits, scaling_router
from simcore.fast.cluster import FastCluster
from simcore.fast.engine import FastEngine
from simcore.fast.log import STATUS_NAMES
from simcore.log import ITERATION_COLUMNS
from simcore.metrics import IterationTotals, ItlSamples, requests_frame_from_columns



def fast_path_reason(cfg, specs) -> str | None:
    """None when the fast path can run this point exactly, else the reason it cannot."""
    if not hasattr(cfg.policy, "schedule"):
        return f"policy {getattr(cfg.policy, 'name', cfg.policy)!r} is not a scheduler"
    if getattr(cfg, "deployment", None) is not None and cfg.deployment.pipeline_parallel_size > 1:
        return "pipeline parallelism (pipeline_parallel_size > 1: batches in flight, simcore/pipeline.py)"
    if lockstep_group_size(cfg) > 1 and num_replicas(cfg) > 1:
        return "the DP ranks of an MoE model stepping together (simcore/dp_lockstep.py)"
    # Every engine setting (experiments/engine_config.py's EngineSettings) is modelled by both engines; a new
    # one that the fast engine cannot model exactly belongs here, as a reason.
    return None


def lockstep_group_size(cfg) -> int:
    """Replicas of the point that step together (simcore/dp_lockstep.py): an MoE model's DP ranks in a
    fixed cluster (not modelled with autoscaling or disaggregation: 1, every replica on its own)."""
    d = getattr(cfg, "deployment", None)
    model = getattr(cfg, "model", None)
    if d is None or model is None or getattr(cfg, "disaggregation", None) is not None \
            or getattr(cfg, "autoscaling", None) is not None:
        return 1
    return dp_group_size(model.is_moe, d.data_parallel_size)


def use_fast_path(cfg, specs) -> bool:
    mode = getattr(cfg.engine, "fast_path", "auto")
    if mode == "off":
        return False
    reason = fast_path_reason(cfg, specs)
    if reason and mode == "on":
        raise SimulationError(f"engine.fast_path: on, but {reason}")
    return reason is None


class Repeated(NDArrayOperatorsMixin):
    """`np.repeat(values, counts)`, built only when used as an array (np.asarray, arithmetic, len): the
    pooled per-token ITL gaps a 1M-request run would spend gigabytes on unless someone asks for them."""

    def __init__(self, values: np.ndarray, counts: np.ndarray):
        self.values, self.counts = values, counts

    def __array__(self, dtype=None, copy=None):
        out = np.repeat(self.values, self.counts)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __len__(self) -> int:
        return int(self.counts.sum())

    @property
    def size(self) -> int:
        return len(self)

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(np.asarray(x) if isinstance(x, Repeated) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)


def num_replicas(cfg) -> int:
    """Engine replicas of the point: a cluster's, both pools of a disaggregated deployment, else 1."""
    d = getattr(cfg, "disaggregation", None)
    if d is not None:
        return d.num_prefill_replicas + d.num_decode_replicas
    autoscaling = getattr(cfg, "autoscaling", None)
    if autoscaling is not None:   # every replica it may start, idle until it does
        return autoscaling["max_replicas"]
    cluster = getattr(cfg, "cluster", None)
    return cluster.num_replicas if cluster is not None else 1


class ColumnSpill:
    """Iteration columns (duration, queue, running, KV blocks) spilled to an unnamed temporary file as a
    streamed run goes, read back chunk by chunk once for the summary's exact time-weighted sums
    (simcore.metrics.IterationTotals): 20 bytes an iteration on disk instead of about 14 in memory."""
    DTYPE = np.dtype([("duration_s", "f8"), ("num_waiting", "i4"), ("num_running", "i4"), ("kv_blocks_used", "i4")])

    def __init__(self):
        import tempfile
        self.file = tempfile.TemporaryFile()   # removed when closed (or at exit)
        self.rows: list[int] = []

    def write(self, duration_s, num_waiting, num_running, kv_blocks_used) -> None:
        rec = np.empty(len(duration_s), self.DTYPE)
        rec["duration_s"], rec["num_waiting"], rec["num_running"] = duration_s, num_waiting, num_running
        rec["kv_blocks_used"] = kv_blocks_used
        self.file.write(rec.tobytes())
        self.rows.append(len(rec))

    def chunks(self):
        """(duration, queue, running, KV blocks) arrays per chunk written, in order; then the file goes."""
        self.file.seek(0)
        for n in self.rows:
            rec = np.frombuffer(self.file.read(n * self.DTYPE.itemsize), self.DTYPE)
            yield rec["duration_s"], rec["num_waiting"], rec["num_running"], rec["kv_blocks_used"]
        self.file.close()


def run_fast(cfg, limits: EngineLimits, cost_model, specs, iteration_writer=None, handed_over: bool = False,
             keep: dict | None = None) -> tuple:
    """Simulate `specs` under `cfg` on the fast path, one engine, a cluster of them (simcore/fast/cluster.py) or
    a disaggregated deployment (simcore/fast/disagg.py):
    (requests frame, iterations, ITL, the replicas' prefix-caching pools, the disaggregated deployment or
    None: its hand-offs) where ITL is (gap values, counts) weighted samples, then every gap and when it ended, in time
    order, expanded on use (`Repeated`; within one iteration the order of equal-time gaps differs from the
    SimPy log's). `iterations` is the iterations frame, or with `iteration_writer` (a
    experiments.tables.TableWriter; one engine or a cluster, not a disaggregated deployment) the rows are streamed to it in chunks as the run goes
    and `iterations` is their IterationTotals (what the summary needs) instead, and the ITL samples are
    gathered in canonical form as the run goes (simcore.metrics.ItlSamples; no end times: None); a
    cluster's totals then carry `by_replica`, each replica's own IterationTotals.
    `handed_over`: `specs` is a one-item list holding the specs, which this empties, so that they are freed
    as soon as the engine is done with them (the caller keeps no other reference). `keep`: with autoscaling,
    `keep["autoscaling"]` is set to the scaler (simcore.autoscaler.Autoscaling: its log and GPU time)."""
    if handed_over:
        specs = specs.pop()
    arrival = cfg.workload.arrival
    closed = (min(arrival.concurrency, len(specs)), arrival.think_time_s) if arrival.is_closed else None
    totals = IterationTotals(spill=ColumnSpill()) if iteration_writer is not None else None

    by_replica: dict[int, IterationTotals] = {}   # a cluster's: its replicas table's sums, spilled likewise

    def sink(floats: np.ndarray, ints: np.ndarray, replicas: np.ndarray | None = None) -> None:
        frame = iterations_frame(floats, ints, replicas)
        totals.add(frame)
        if replicas is not None:
            for r in np.unique(replicas).tolist():
                part = by_replica.setdefault(r, IterationTotals(spill=ColumnSpill()))
                part.add(frame[replicas == r])
        iteration_writer.write(frame)

    disagg, itl = None, None
    if getattr(cfg, "disaggregation", None) is not None:
        if iteration_writer is not None:
            raise ValueError("run_fast: a disaggregated deployment's iteration rows are not streamed")
        engine = disagg = disaggregation.build_fast(cfg, cost_model, limits, specs, closed)
    elif num_replicas(cfg) > 1 or getattr(cfg, "autoscaling", None) is not None:
        itl = ItlSamples() if iteration_writer is not None else None   # streamed: canonical ITL as it goes
        streamed = {"iteration_sink": sink if iteration_writer is not None else None,
                    "itl_sink": itl.add if itl is not None else None}
        if getattr(cfg, "autoscaling", None) is not None:   # simcore/fast/autoscaling.py
            engine = FastCluster(cfg.policy, cost_model, limits, specs, scaling_router(cfg), num_replicas(cfg),
                                 closed=closed, autoscaling=scaling_limits(cfg), **streamed)
            if keep is not None:
                keep["autoscaling"] = engine.cluster
        else:
            engine = FastCluster(cfg.policy, cost_model, limits, specs, cfg.cluster.router,
                                 cfg.cluster.num_replicas, closed=closed, **streamed)
    else:
        itl = ItlSamples() if iteration_writer is not None else None   # streamed: canonical ITL as it goes
        engine = FastEngine(cfg.policy, cost_model, limits, specs, closed=closed,
                            iteration_sink=sink if iteration_writer is not None else None,
                            itl_sink=itl.add if itl is not None else None)
    if handed_over:
        del specs   # the engine's own list is then the only one
    log = engine.simulate()
    prefix_caches = engine.prefix_caches
    del engine   # its per-request records: only the log is needed from here on
    if log.num_unfinished:
        raise SimulationError(f"{cfg.policy.name}: {log.num_unfinished} requests never finished (fast path)")
    if itl is not None:   # only the samples matter: the gaps' order and end times are not saved
        values, counts = itl.finish()
        itl = (values, counts, Repeated(values, counts), None)
    else:
        itl = (log.itl_values_s, log.itl_counts, Repeated(log.itl_values_s, log.itl_counts),
               Repeated(log.itl_end_s, log.itl_counts))
    iterations = totals.finish() if totals is not None else iterations_table(log)
    if totals is not None:   # a streamed cluster's per-replica sums (simcore.metrics.replicas_frame)
        iterations.by_replica = {r: part.finish() for r, part in by_replica.items()}
    return requests_table(log), iterations, itl, prefix_caches, disagg


def requests_table(log) -> pd.DataFrame:
    """The requests frame, taking over the log's columns (the log is not read again)."""
    n = len(log.request_id)
    reasons = np.full(n, None, object)
    for k, reason in log.reject_reason.items():
        reasons[k] = reason
    return requests_frame_from_columns({
        "request_id": np.asarray(log.request_id, dtype=np.int64),
        "replica_id": np.zeros(n, dtype=np.int64) if log.replica_id is None else log.replica_id.astype(np.int64),
        "arrival_s": log.arrival_s, "prompt_tokens": log.prompt_tokens, "output_tokens": log.output_tokens,
        "admitted_s": log.admitted_s, "first_token_s": log.first_token_s, "finish_s": log.finish_s,
        "num_preemptions": log.num_preemptions.astype(np.int64),
        "status": np.array(STATUS_NAMES, dtype=object)[log.status], "reject_reason": reasons,
        "priority": log.priority if log.priority is not None else np.zeros(n, dtype=np.int64),
    })


def iterations_table(log) -> pd.DataFrame:
    return iterations_frame(log.iteration_floats, log.iteration_ints, log.iteration_replica_id)


def empty_iterations() -> pd.DataFrame:
    return iterations_frame(np.zeros((0, 2)), np.zeros((0, len(ITERATION_COLUMNS) - 3), dtype=np.int32))


def iterations_frame(f: np.ndarray, i: np.ndarray, replica_id: np.ndarray | None = None) -> pd.DataFrame:
    """Iteration rows from the fast engine's compact columns (float64 pairs, int32 counts; a cluster's
    replica of each row, else replica 0)."""
    columns = {"start_s": f[:, 0].copy(), "duration_s": f[:, 1].copy()}
    for k, name in enumerate(ITERATION_COLUMNS[2:-1]):
        columns[name] = i[:, k].astype(np.int64)
    columns["replica_id"] = np.zeros(len(f), dtype=np.int64) if replica_id is None else replica_id.astype(np.int64)
    return pd.DataFrame(columns, copy=False)   # one block per column: no consolidating copy (millions of rows)
