"""Reading a sweep file: strict YAML (a key given twice is an error) and relative trace paths made relative
to the file, so a sweep runs the same from any working directory. No validation beyond YAML itself: that is
experiments/config.py's."""
from __future__ import annotations

from pathlib import Path

import yaml

from experiments.configcheck import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base loader says so
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_sweep_file(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such sweep file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the sweep file ({getattr(e, 'strerror', None) or e.__class__.__name__})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    resolve_relative_paths(data, path.parent)
    return data


def resolve_relative_paths(sweep: dict, base_dir: Path) -> None:
    """Make a relative `workload.trace.path` (also in `grid`) and a `hardware:` file path relative to the
    sweep file's folder, so a
    sweep runs the same from any working directory. Mutates `sweep`."""
    def fix(trace) -> None:
        if isinstance(trace, dict) and isinstance(trace.get("path"), str) and not Path(trace["path"]).is_absolute():
            trace["path"] = str((base_dir / trace["path"]).resolve())

    workload = sweep.get("workload")
    if isinstance(workload, dict):
        fix(workload.get("trace"))
    hw = sweep.get("hardware")   # a GPU described in its own YAML/JSON file (costmodels/gpuspec.py)
    if isinstance(hw, str) and Path(hw).suffix.lower() in (".yaml", ".yml", ".json") and not Path(hw).is_absolute():
        sweep["hardware"] = str((base_dir / hw).resolve())
    grid = sweep.get("grid")
    if isinstance(grid, dict):
        for k, values in grid.items():
            if isinstance(values, list) and k in ("workload.trace.path", "workload.trace", "workload"):
                for i, v in enumerate(values):
                    if k == "workload.trace.path" and isinstance(v, str) and not Path(v).is_absolute():
                        values[i] = str((base_dir / v).resolve())
                    elif k == "workload.trace":
                        fix(v)
                    elif isinstance(v, dict):
                        fix(v.get("trace"))
