#!/usr/bin/env bash
# Thread scaling of the CPU backend beside PyTorch's CPU SDPA (when python3
# imports torch): ViT-B/16 batch 64 and N = 4096 (H = 12, d = 64), forward and
# backward, f32 and bf16, at OMP_NUM_THREADS = 1, 2, 4, 8, 16 (up to nproc).
# Prints a table of GFLOP/s, speedup over one thread and ratio to torch. From
# the project root, after a build:
#
#   bash bench/cpu_scaling.sh                     # build/tools/attn, every count
#   ATTN=build-cpu/tools/attn bash bench/cpu_scaling.sh --threads 1,4,16
#   bash bench/cpu_scaling.sh --quick             # batch 8 and N = 1024: a smoke test
#
# Other options go to cpu_bench.py (--repeat R, --json F). PYTHON picks the
# interpreter that has torch (default python3); the full log goes to $LOG.
set -eu -o pipefail
ATTN=${ATTN:-build/tools/attn}
[ -x "$ATTN" ] || { echo "cpu_scaling.sh: no $ATTN; build first (cmake --build build)" >&2; exit 2; }
exec "${PYTHON:-python3}" "$(dirname "$0")/cpu_bench.py" scaling --attn "$ATTN" \
  --log "${LOG:-/tmp/cpu_scaling.log}" "$@"
