"""Experiments: sweep files, wiring, the `python -m experiments.run` entry point."""
