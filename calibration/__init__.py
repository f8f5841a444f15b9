"""Calibration: capture CUDA kernel timings with torch and fit cost profiles (the only package importing torch)."""
