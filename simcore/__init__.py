"""Discrete-event core: requests, batches, the paged KV pool, the engine process and its metrics."""
from simcore.batch import Batch, DecodeShortcut, Scheduled
from simcore.costmodel import ConstantCost, CostModel
from simcore.engine import Engine
from simcore.errors import SimulationError
from simcore.limits import EngineLimits
from simcore.log import EngineLog, IterationRecord, RequestEvent, RequestRecord
from simcore.wiring import run_replica
from simcore.request import Request, RequestSpec, Status
from simcore.view import EngineView, Policy, max_total_tokens

__all__ = ["Batch", "DecodeShortcut", "Scheduled", "ConstantCost", "CostModel", "Engine", "EngineLimits",
           "SimulationError", "EngineLog", "IterationRecord", "RequestEvent", "RequestRecord", "run_replica",
           "Request", "RequestSpec", "Status", "EngineView", "Policy", "max_total_tokens"]
