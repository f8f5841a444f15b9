"""Traffic: synthetic arrival processes and length distributions, prefix-sharing shapes, trace replay."""
from workloads.distributions import LengthDist, parse_length_dist
from workloads.errors import WorkloadError
from workloads.synthetic import Arrival, GeneratedRequests, Workload, generate, parse_arrival, parse_workload
from workloads.traces import FORMATS, Trace, TraceWorkload, load_trace

__all__ = ["LengthDist", "parse_length_dist", "WorkloadError", "Arrival", "GeneratedRequests", "Workload",
           "generate", "parse_arrival", "parse_workload", "FORMATS", "Trace", "TraceWorkload", "load_trace"]
