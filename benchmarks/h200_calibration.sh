#!/usr/bin/env bash
# One prepared run for a session that has an H200 (or H100): calibrate Llama-3-8B with the project's own
# capture, fit the profile, and compare it with the profile fitted from NVIDIA's published tables; then
# calibrate a MoE model (Qwen3-30B-A3B: 128 experts, top-8) and an MLA one (DeepSeek-V3's MLA + MoE layer
# at the per-GPU shapes of TP 8: 16 heads, 256 experts of width 256), with fp8 GEMMs on sm89+. NCCL
# all-reduces are timed only with 2+ GPUs (one H200: skipped, the reason in meta.json).
# Needs torch with CUDA, numpy, scipy, pandas, matplotlib, tqdm, pyyaml (not simpy).
#
# The MoE and MLA configs come from aiconfigurator-core, which the device machine lacks: copy them into an
# ignored folder of the checkout first and carry it (`carry: [".configs"]`):
#   mkdir -p .configs && grep -qx '/.configs/' .git/info/exclude || echo /.configs/ >> .git/info/exclude
#   python -c "import shutil; from costmodels.hfconfig import packaged_config as p; [shutil.copy(p(m), '.configs/')
#              for m in ('Qwen/Qwen3-30B-A3B', 'deepseek-ai/DeepSeek-V3')]"
#
#   OUT=/some/dir bash benchmarks/h200_calibration.sh                 # device machine, repo root
#   OUT=/tmp/dry DEVICE=cpu MODEL=tiny REFERENCE=roofline MOE_MODEL=tiny_moe.json MLA_MODEL=tiny_mla.json \
#     MLA_TP=1 bash benchmarks/h200_calibration.sh                    # CPU dry run (tiny configs: tests/test_model_families.py)
# MOE_MODEL=none or MLA_MODEL=none leaves that calibration out.
#
# Writes (8 files at most, the device tool's limit): $OUT/nvidia-smi.txt, $OUT/run.log (every capture and
# fit report), $OUT/compare.txt, $OUT/calib/profile.json (Llama), $OUT/moe/profile.json,
# $OUT/mla/profile.json and $OUT/all.tar.gz (each folder's measurements.csv, meta.json, fit_report.json,
# fit.png). Expected on one H200: 1-2 minutes for Llama (about 20 s of kernel time), a few more for each
# of the others (their grids are about twice as large). To ship the Llama result:
#   cp $OUT/calib/profile.json costmodels/profiles/llama-3-8b__h200-sxm__tp1__bf16.json
# (that exact name is auto-selected; any other name, and the MoE/MLA profiles, with `profile: <path>`).
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to an output folder}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-llama-3-8b}
REFERENCE=${REFERENCE:-llama-3-8b__h200-sxm__tp1__bf16}
MOE_MODEL=${MOE_MODEL:-.configs/Qwen--Qwen3-30B-A3B_config.json}
MLA_MODEL=${MLA_MODEL:-.configs/deepseek-ai--DeepSeek-V3_config.json}
MLA_TP=${MLA_TP:-8}
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
# --keep-bad-fit: a GPU session is rare; a family over the held-out bar is still reported loudly in
# run.log and marked in the profile, but the profile and the comparison below are kept for inspection.
calibrate() {   # name, model, extra options
  local name=$1 model=$2
  shift 2
  if [ "$model" = none ]; then return 0; fi
  if [ ! -e "$model" ] && [[ "$model" == */* ]]; then
    echo "!!! $name: $model not found (copy the configs into .configs and carry it: see the header)" | tee -a "$OUT/run.log"
    return 0
  fi
  echo "=== $name: $model $*" | tee -a "$OUT/run.log"
  time $PY -m calibration.capture --model "$model" --device "$DEVICE" --out "$OUT/$name" --quiet --keep-bad-fit "$@" \
    2>&1 | tee -a "$OUT/run.log"
}
calibrate calib "$MODEL"
$PY -m calibration.compare "$REFERENCE" "$OUT/calib/profile.json" | tee "$OUT/compare.txt"
calibrate moe "$MOE_MODEL"
calibrate mla "$MLA_MODEL" --tp "$MLA_TP"
# everything but the profiles in one archive (the device tool returns 8 files)
ls -la "$OUT" "$OUT"/*/ >> "$OUT/run.log"
(cd "$OUT" && dirs=$(ls -d calib moe mla 2>/dev/null) && tar czf all.tar.gz --exclude=profile.json $dirs \
  && find $dirs -type f ! -name profile.json -delete)
find "$OUT" -type f | sort
