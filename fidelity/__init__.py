"""Fidelity: real serving engines run and compared with the simulator.

Runs real vLLM (vllm_run, with the recording scheduler of vllm_hooks), reads real runs from any benchmark
tool (realruns), drives vLLM's own V1 scheduler beside ours (vllm_scheduler), fits step-cost models to real
runs (fit_engine, stepfit, step_calibration), compares runs with the simulator (compare), and runs our own
small torch engine (torch_llama, torch_backend) as a real backend to validate against (validate). It sits
above experiments/ (it replays real runs through the same wiring users run) and may import calibration/;
nothing below imports it.
"""
