"""Moved: `python -m calibration.run` is `python -m calibration.capture`; its `--steps` option is
`python -m fidelity.step_calibration` (a whole-step fit on our own torch engine is fidelity's work)."""
import sys

from calibration.moved import forward, notice, run


def main(argv: list[str]) -> int:
    if "--steps" not in argv:
        forward("calibration.run", "calibration.capture", argv)
    notice("calibration.run --steps", "calibration.capture + fidelity.step_calibration")
    rest, steps_requests, i = [], "48", 0
    while i < len(argv):
        if argv[i] == "--steps":
            i += 1
        elif argv[i] == "--steps-requests":
            steps_requests, i = argv[i + 1], i + 2
        else:
            rest.append(argv[i])
            i += 1
    rc = run("calibration.capture", rest)
    if rc not in (0, 3):   # 3: a refused kernel fit; the step model does not use it
        return rc
    keep = [a for k, a in enumerate(rest) if a in ("--model", "--device", "--out", "--quiet")
            or (k > 0 and rest[k - 1] in ("--model", "--device", "--out"))]
    return run("fidelity.step_calibration", [*keep, "--num-requests", steps_requests]) or rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
