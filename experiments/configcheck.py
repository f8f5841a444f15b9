"""The sweep file's error type and the checks every section parser shares (experiments/config.py and the
modules it delegates to, search.py, capacity.py): each error is one line naming the dotted key."""
from __future__ import annotations

import math

from workloads.errors import check_keys as shared_check_keys
from workloads.errors import finite_number


class ConfigError(ValueError):
    """A bad sweep file; the message names the offending key and fits on one line."""


def check_keys(section: str, spec, known) -> None:
    """Refuse any key of the `section:` mapping that is not in `known`, naming it and the known ones."""
    shared_check_keys(section, spec, known, ConfigError)


def number(key: str, v, **kw):
    """`workloads.errors.finite_number` raising ConfigError: the one number check of the sweep file."""
    return finite_number(key, v, error=ConfigError, **kw)


def check_type(key: str, value, default, allow_none: bool = False):
    """`value` read from YAML must have the type of the field's `default` (bool, int, float or str); a
    field whose default is None is left to its dataclass. Ranges are the dataclasses' own checks."""
    if value is None and allow_none:
        return None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int) or (default is None and key.endswith(("num_gpu_blocks", "max_model_len"))):
        return number(key, value, integer=True)
    if isinstance(default, float):
        return number(key, value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def check_tree(value, key: str = "", inf_ok: bool = False) -> None:
    """Refuse what no key of a sweep may hold, wherever it is: a mapping key that is not a string (YAML reads
    `on:`, `1:` or `true:` as a boolean or a number), NaN, and infinity except in an arrival rate
    (`rate_per_s: .inf` sends everything at t = 0). Each error names the dotted key."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                where = f"{key}." if key else ""
                raise ConfigError(f"{where}{k!r}: a key must be a string, got {type(k).__name__} {k!r} "
                                  "(YAML reads on/off/yes/no/true/false and numbers as such; quote it)")
            check_tree(v, f"{key}.{k}" if key else k, k.endswith("rate_per_s"))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_tree(v, f"{key}[{i}]", inf_ok)
    elif isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not inf_ok)):
        raise ConfigError(f"{key}: {value!r} is not allowed here (expected a finite number)")
