#!/usr/bin/env bash
# Optional GPU check: loom against Lightning Fabric on CUDA, in bf16-mixed and 16-mixed, with the
# same model, weights, batches and step count (benchmarks/fabric/fabric_vs_loom.py --device cuda).
# Meant for a GPU machine after scripts/gpu-check.sh has configured its build tree; builds only
# loom_fabric_train there. The machine may have no network: lightning must already be installed
# in the python with torch, else this check reports SKIPPED and exits 77.
#
# Usage: scripts/gpu-fabric-check.sh [report-dir]     (default $OUT, else build-gpu-report)
#   LOOM_PYTHON     the python with torch and lightning (default: first of python3,
#                   /opt/torch/.venv/bin/python3, ~/.cache/loom/torch-*/bin/python with lightning)
#   LOOM_GPU_BUILD  build tree configured by gpu-check.sh (default build-gpu)
#   JOBS            build jobs (default nproc)
# Exit status: 0 ran; 1 a step failed; 77 no GPU or no lightning.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$root/build-gpu-report}}
build=${LOOM_GPU_BUILD:-$root/build-gpu}
mkdir -p "$out"
report="$out/gpu-fabric-check.md"
: >"$report"
say() { echo "$*" | tee -a "$report"; }

say "# loom vs Lightning Fabric on CUDA (optional)"
py=""
for c in "${LOOM_PYTHON:-}" python3 /opt/torch/.venv/bin/python3 "$HOME"/.cache/loom/torch-*/bin/python; do
  [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
  if "$c" -c 'import torch, lightning' >/dev/null 2>&1; then py=$(command -v "$c"); break; fi
done
if [ -z "$py" ]; then
  say "- SKIPPED: no python with both torch and lightning (install lightning beforehand; this"
  say "  check does not download anything)"
  exit 77
fi
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  say "- SKIPPED: torch sees no CUDA device"
  exit 77
fi
say "- python: $py; $("$py" -c 'import torch, lightning; print("torch", torch.__version__, "lightning", lightning.__version__, torch.cuda.get_device_name(0))')"
[ -f "$build/CMakeCache.txt" ] || { say "- $build is not configured: run scripts/gpu-check.sh first"; exit 1; }
cmake --build "$build" --target loom_fabric_train -j "${JOBS:-$(nproc)}" >"$out/fabric-build.log" 2>&1 ||
  { tail -n 20 "$out/fabric-build.log"; say "- build of loom_fabric_train failed"; exit 1; }
"$py" "$root/benchmarks/fabric/fabric_vs_loom.py" --device cuda \
  --loom-bin "$build/benchmarks/fabric/loom_fabric_train" --out "$out/fabric_vs_loom_cuda.json" \
  --precisions bf16-mixed,16-mixed --sizes tiny,medium,large --reps 3 2>&1 | tee -a "$report"
status=${PIPESTATUS[0]}
say ""
say "Raw: fabric_vs_loom_cuda.json. 16-mixed: both sides scale the loss (torch.amp.GradScaler"
say "against loom::amp::GradScaler), so parameters should agree to the last bit unless a step"
say "was skipped on one side only."
exit "$status"
