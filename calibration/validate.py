"""Moved: `python -m calibration.validate` is `python -m fidelity.validate` (real-engine work lives in fidelity/)."""
import sys

from calibration.moved import forward

if __name__ == "__main__":
    forward("calibration.validate", "fidelity.validate", sys.argv[1:])
