"""Choose the cost model for a simulation: a measured profile (named, a file, or the shipped one matching
the model's architecture, GPU, TP and dtype), else NVIDIA's kernel tables with the [aic] extra, else the
roofline prior; each says what it is in `describe()` (costmodels/basis.py turns that into one line).

A shipped profile is chosen by architecture, not by name: Llama-3-8B and Llama-3.1-8B have the same layers
and differ only in their context length and rope scaling, which no step price depends on (the context
length bounds prompts and the memory plan, both priced from the simulated model's own shape)."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from costmodels import aic
from costmodels.catalog import GPU, CatalogError, ModelShape
from costmodels.deployment import Deployment
from costmodels.profile import profile_cost_model, read_profile
from costmodels.roofline import RooflineCostModel
from costmodels.stepmodel import FORMAT as STEPFIT_FORMAT
from costmodels.stepmodel import stepfit_from_json

PROFILES_DIR = Path(__file__).parent / "profiles"


def shipped_profile_name(model: str, gpu: str, tp: int, dtype: str) -> str:
    """File stem of a shipped profile under costmodels/profiles/."""
    return f"{model}__{gpu}__tp{tp}__{dtype}"


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def same_architecture(a: ModelShape, b: ModelShape) -> bool:
    """Every field a step's price depends on is equal: all but the name and the context length."""
    skip = {"name", "max_model_len"}
    return all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a) if f.name not in skip)


def shipped_profile_path(model: ModelShape, gpu: str, tp: int, dtype: str) -> Path | None:
    """The shipped profile for `model` (by name, else for a catalog model of the same architecture) on
    `gpu` at this TP and dtype; None when there is none."""
    path = PROFILES_DIR / f"{shipped_profile_name(model.name, gpu, tp, dtype)}.json"
    if path.exists():
        return path
    from costmodels.catalog import MODELS
    for other in MODELS.values():
        if other.name != model.name and same_architecture(other, model):
            path = PROFILES_DIR / f"{shipped_profile_name(other.name, gpu, tp, dtype)}.json"
            if path.exists():
                return path
    return None


def load_cost_model(profile: str | None, model: ModelShape, gpu: GPU, tp: int = 1, dtype: str = "bf16",
                    deployment: Deployment | None = None):
    """`profile`: "roofline" forces the datasheet prior; "aic[:framework[:version]]" builds one from the
    installed aiconfigurator-core tables (costmodels/aic.py); a shipped profile name or a path to a profile
    JSON selects that profile; None auto-selects the shipped profile for (model, gpu, tp, dtype) when
    there is one, else the tables when the [aic] extra is installed and has the GPU, else the roofline
    prior. `deployment` (precision, parallelism)
    overrides `tp` and `dtype` when given."""
    d = deployment or Deployment(dtype=dtype, tensor_parallel_size=tp)
    tp, dtype = d.tensor_parallel_size, d.dtype
    if profile == "roofline":
        return RooflineCostModel(model, gpu, deployment=d)
    if profile is not None and profile.split(":")[0] == "aic":
        return aic.aic_cost_model(profile, model, gpu, d)
    if profile is None:
        path = shipped_profile_path(model, gpu.name, tp, dtype)
        if path is None or d != Deployment(dtype=dtype, tensor_parallel_size=tp):
            if aic.tables_root() is not None and gpu.name in aic.DEFAULT_GPUS:   # the [aic] extra is installed
                try:
                    return aic.aic_cost_model("aic", model, gpu, d)
                except CatalogError:
                    pass   # the tables lack this GPU's GEMMs (l4): the prior, which says so
            return RooflineCostModel(model, gpu, deployment=d)  # describe() of the prior says "no measured profile"
    elif (PROFILES_DIR / f"{profile}.json").exists():
        path = PROFILES_DIR / f"{profile}.json"
    else:
        path = Path(profile).expanduser()
        if not path.exists():
            raise CatalogError(f"{profile}: no such profile file or shipped profile "
                               f"(shipped: {', '.join(shipped_profiles()) or 'none'})")
    stepfit = _stepfit_or_none(path, model, dtype)
    if stepfit is not None:
        return stepfit
    if d.weight_format(model) in ("int4", "int8"):
        raise CatalogError(f"{path}: a kernel profile times 16-bit GEMMs and cannot price {model.name}'s "
                           f"{d.weight_format(model)} (AWQ/GPTQ or W8A8) weights; use profile: roofline or aic, "
                           "or a step model fitted on its runs")
    data = read_profile(path)  # a profile named explicitly is used as given; describe() says where it was measured
    return profile_cost_model(data, model, gpu, tp, dtype, source=str(path), deployment=d)


def _stepfit_or_none(path: Path, model: ModelShape, dtype: str):
    """A whole-step model (calibration.capture --steps, fidelity.validate, fidelity.fit_engine) saved at
    `path`, checked against the simulated model and dtype; None when the file is another kind of profile."""
    import json
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # read_profile names the problem
    if not isinstance(data, dict) or data.get("format") != STEPFIT_FORMAT:
        return None
    try:
        step_model = stepfit_from_json(data, str(path))
    except ValueError as e:
        raise CatalogError(str(e)) from None
    if step_model.dtype and step_model.dtype != dtype:
        raise CatalogError(f"{path}: step model was fitted on {step_model.dtype}, the simulation asks {dtype} "
                           f"(set dtype: {step_model.dtype})")
    shape = data.get("model_shape")
    if isinstance(shape, dict):
        mine = {k: getattr(model, k) for k in shape if hasattr(model, k) and k != "name"}
        diff = [k for k, v in mine.items() if shape[k] != v]
        if diff:
            raise CatalogError(f"{path}: step model was fitted on another model shape "
                               f"({', '.join(f'{k} {shape[k]} != {mine[k]}' for k in diff)})")
    return step_model


def cost_model(model: str = "llama-3-8b", hardware: str = "h100-sxm", tp: int = 1, dtype: str = "bf16",
               profile: str | None = None):
    """Notebook entry point by names: `cost_model("llama-3-8b", "h100-sxm").step_time_s(prefill=[(512, 0)],
    decode=[1024] * 64)` gives one iteration's time in seconds, with the same cost model a sweep uses."""
    from costmodels.catalog import get_gpu, get_model
    return load_cost_model(profile, get_model(model), get_gpu(hardware), tp, dtype)
