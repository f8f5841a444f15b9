"""Calibration: kernel timings -> cost profiles.

Captures CUDA (or CPU) kernel timings of a model's forward pass with torch (capture, kernels,
family_kernels, allreduce, layer, grid), imports NVIDIA's published tables (import_aic), and fits profiles
with their held-out error (fit, loggrid_fit, holdout, overheads, measurements). Imports only torch,
numpy/scipy/pandas and costmodels/; real-engine runs and comparisons live in fidelity/.
"""
