"""Fit a whole-step cost model on our own torch engine's iterations (the profile to validate on a CPU).

    python -m fidelity.step_calibration --model tiny --device cpu --out DIR [--num-requests 48] [fidelity.validate options]

Runs the static, continuous and chunked-prefill policies through the real backend (fidelity.torch_backend),
saturated and in closed loops of 1, 2 and 4 users, and fits the whole-step model (fidelity.stepfit) to every
iteration -> DIR/stepfit.json, with its held-out error, and DIR/stepfit_steps.csv (one row per step). Kernel
sums miss what dominates small models on a CPU (operator dispatch, Python); a whole step does not. The
options are fidelity.validate's (same parser), since these are the same runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

from commandline.exits import guarded, refuse, run_main
from costmodels.modelargs import model_arg
from commandline.outputs import OutputError, out_dir
from costmodels.catalog import CatalogError
from fidelity import validate
from simcore.engine import SimulationError


PROG = "python -m fidelity.step_calibration"


def calibrate_steps(model_name: str, device: str, out: Path, quiet: bool = False, extra: list[str] = ()) -> Path:
    """The whole-step calibration for `model_name` on `device`, saved as OUT/stepfit.json.
    `extra`: more fidelity.validate options (workload size, policies)."""
    argv = ["--model", model_name, "--device", device, "--no-reexec", "--out", str(out),
            *(["--quiet"] if quiet else []), *extra]
    argv = _with_cpu_clock(argv)   # recorded as run: the clock options are part of how the steps were timed
    return calibrate(validate.parse_args(argv, prog=PROG), argv)


def _with_cpu_clock(argv: list[str]) -> list[str]:
    """On a CPU the steps are timed by the thread's CPU time, normalised for the machine's speed."""
    cpu = "--device" in argv and argv[argv.index("--device") + 1] == "cpu"
    return [*argv, "--clock", "cpu", "--speed-normalise"] if cpu and "--clock" not in argv else argv


def calibrate(vargs, argv: list[str]) -> Path:
    out = out_dir(vargs.out, create=True)
    backend = validate.make_backend(vargs, validate.build_config(vargs, vargs.policies[0], float("inf")))
    step_model = validate.calibrate_stepfit(vargs, backend, out / "stepfit_steps.csv")
    path = out / "stepfit.json"
    validate.save_stepfit(step_model, path, vargs.model, vargs.device, backend,
                          step_run_options=" ".join(argv))  # the options the steps ran with
    h = step_model.held_out or {}
    print(f"wrote {path}: whole-step model, held-out median {h.get('median_ape_pct')}% / "
          f"p90 {h.get('p90_ape_pct')}% over {h.get('steps')} steps")
    return path


USER_ERRORS = (validate.ConfigError, CatalogError, SimulationError, OutputError)


def main(argv: list[str] | None = None) -> int:
    from_cli = argv is None
    given = list(sys.argv[1:] if argv is None else argv)
    argv = _with_cpu_clock(given)
    try:
        vargs = validate.parse_args(_with_cpu_clock(argv), prog=PROG, description=__doc__.splitlines()[0])
        model_arg(vargs.model)
        out_dir(vargs.out)   # before the runs, not after
    except USER_ERRORS as e:
        return refuse(e)
    if vargs.device == "cpu" and from_cli and not vargs.no_reexec:
        validate.reexec_with_tunables("fidelity.step_calibration", given)
    from fidelity.torch_backend import BackendError
    return guarded(lambda _: calibrate(vargs, _with_cpu_clock(argv)) and 0, None, (*USER_ERRORS, BackendError),
                   kept="no step model written (it is fitted once every run has finished)")


if __name__ == "__main__":
    run_main(main)
