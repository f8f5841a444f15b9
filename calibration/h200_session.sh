#!/usr/bin/env bash
# One prepared run for a session that has an H200 (or H100): calibrate Llama-3-8B with the project's own
# capture, fit the profile, and compare it with the profile fitted from NVIDIA's published tables.
# Needs torch with CUDA, numpy, scipy, pandas, matplotlib, tqdm, pyyaml (not simpy).
#
#   OUT=/some/dir bash calibration/h200_session.sh                 # device machine, repo root
#   OUT=/tmp/dry DEVICE=cpu MODEL=tiny REFERENCE=roofline bash calibration/h200_session.sh   # CPU dry run
#
# Writes $OUT/calib/{measurements.csv,meta.json,profile.json,fit_report.json,fit.png}, $OUT/run.log and
# $OUT/compare.txt (8 files at most, the device tool's limit). Expected on one H200: 1-2 minutes (about
# 20 s of kernel time; the rest is CUDA start-up, allocation and the fit). To ship the result:
#   cp $OUT/calib/profile.json costmodels/profiles/llama-3-8b__h200-sxm__tp1__bf16.json
# (that exact name is auto-selected; any other name is used with `profile: <name>`).
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to an output folder}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-llama-3-8b}
REFERENCE=${REFERENCE:-llama-3-8b__h200-sxm__tp1__bf16}
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
# --keep-bad-fit: a GPU session is rare; a family over the held-out bar is still reported loudly in
# run.log and marked in the profile, but the profile and the comparison below are kept for inspection.
time $PY -m calibration.run --model "$MODEL" --device "$DEVICE" --out "$OUT/calib" --quiet --keep-bad-fit 2>&1 | tee "$OUT/run.log"
$PY -m calibration.compare "$REFERENCE" "$OUT/calib/profile.json" | tee "$OUT/compare.txt"
