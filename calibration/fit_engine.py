"""Moved: `python -m calibration.fit_engine` is `python -m fidelity.fit_engine` (real-engine work lives in fidelity/)."""
import sys

from calibration.moved import forward

if __name__ == "__main__":
    forward("calibration.fit_engine", "fidelity.fit_engine", sys.argv[1:])
