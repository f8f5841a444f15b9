"""The sweep file's `gateway:` section: admission control ahead of each replica (simcore/gateway.py).

  gateway: {max_waiting: 64, max_outstanding: 512, max_queue_s: 10, client_timeout_s: 30}

Every key optional (absent: no such limit); at least one must be given."""
from __future__ import annotations

from experiments.configcheck import ConfigError, check_keys, number
from simcore.gateway import GatewayLimits

GATEWAY_KEYS = {"max_waiting": True, "max_outstanding": True, "max_queue_s": False, "client_timeout_s": False}


def parse_gateway(spec) -> GatewayLimits | None:
    if spec is None:
        return None
    check_keys("gateway", spec, set(GATEWAY_KEYS))
    if not spec:
        raise ConfigError(f"gateway: expected at least one of {', '.join(GATEWAY_KEYS)}")
    values = {k: number(f"gateway.{k}", v, minimum=0, strict=True, integer=GATEWAY_KEYS[k])
              for k, v in spec.items() if v is not None}
    return GatewayLimits(**values)
