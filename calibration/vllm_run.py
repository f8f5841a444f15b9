"""Moved: `python -m calibration.vllm_run` is `python -m fidelity.vllm_run` (real-engine work lives in fidelity/)."""
import sys

from calibration.moved import forward

if __name__ == "__main__":
    forward("calibration.vllm_run", "fidelity.vllm_run", sys.argv[1:])
