"""The fast engines: simcore.engine's semantics without SimPy, bitwise, for one replica (`FastEngine`), a
cluster behind a router (`FastCluster`) and a disaggregated deployment (`FastDisagg`). Their imports point
one way: engine <- cluster <- disagg, each on the shared core (simcore.decisions, simcore.rules, the KV pool)."""
from simcore.fast.cluster import FastCluster
from simcore.fast.disagg import FastDisagg
from simcore.fast.engine import FastEngine
from simcore.fast.log import STATUS_NAMES, FastLog

__all__ = ["FastCluster", "FastDisagg", "FastEngine", "FastLog", "STATUS_NAMES"]
