class WorkloadError(ValueError):
    """Bad workload input; the message names the offending key or file in one line."""
