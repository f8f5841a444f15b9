"""What an answer rests on besides its cost model (costmodels/basis.py): which engine, at which version, each
scheduling policy imitates, and how many draws of the traffic (seeds) each figure comes from. The console
and every summary.md say both beside the cost model."""
from __future__ import annotations

from policies import imitated


def schedules_line(policies, vllm_versions=(), routers=()) -> str:
    """'schedules as chunked_prefill: vLLM V1's scheduler, ...': which engine and version each policy of
    the answers imitates (policies.imitated; `vllm_versions`: the results' `vllm_version` column), and how a
    router that imitates an engine's front end routes (`routers`: the results' `router_basis` column)."""
    routes = list(dict.fromkeys(r for r in routers if isinstance(r, str)))
    return f"schedules as {imitated(policies, vllm_versions)}" + "".join(f"; routes as {r}" for r in routes)


def router_basis_column(router) -> dict:
    """A results row's `router_basis`: what a router that imitates an engine's front end (vllm_dp) does, in
    words; none for the others."""
    describe = getattr(router, "describe", None)
    return {} if describe is None else {"router_basis": describe()}


def point_router_bases(points) -> list:
    """The `router_basis` of each point's cluster or prefill-pool router, where it has one."""
    out = []
    for p in points:
        cfg = p.config
        router = (cfg.cluster.router if cfg.cluster is not None
                  else cfg.disaggregation.router if cfg.disaggregation is not None else None)
        out.append(router_basis_column(router).get("router_basis"))
    return out


def router_bases_of(results) -> list:
    """The `router_basis` column of a results table."""
    return list(results["router_basis"]) if "router_basis" in results else []


def vllm_version_column(policy) -> dict:
    """A results row's `vllm_version`: the release a chunked_prefill point ran as; none for other policies."""
    version = getattr(policy, "vllm_version", None)
    return {} if version is None else {"vllm_version": version}


def point_vllm_versions(points) -> list:
    """The release each point's policy runs as, where it has one (chunked_prefill's engine.vllm_version)."""
    return [vllm_version_column(p.config.policy).get("vllm_version") for p in points]


def vllm_versions_of(results) -> list:
    """The `vllm_version` column of a results table (the release each chunked_prefill point ran as)."""
    return list(results["vllm_version"]) if "vllm_version" in results else []


def seeds_line(num_seeds: int) -> str:
    """How many draws of the traffic each answer rests on, and what that leaves unmeasured."""
    if num_seeds <= 1:
        return "one seed per point (one draw of the traffic: its spread is not measured; `seeds: [0, 1, 2]` is)"
    return f"{num_seeds} seeds per point (what combines them takes their mean)"
