#!/usr/bin/env bash
# Decoding on this machine's CPU: attn's decode rows (bf16 and f32, 32 query
# heads over 8 KV heads, d = 128, plain and paged) in GB/s against the memory
# read rate that `attn bandwidth` measures, and the full-bias prefill's cost
# (with --bias over without). From the project root, after a build in build/:
#
#   bash bench/cpu_decode.sh            # the table; about two minutes on 2 cores
#   bash bench/cpu_decode.sh --quick    # keys cut 16x, prefill 4x: a smoke test
#
# Other options go to decode_bench.py (--shapes 1x8192, --dtypes f32, --json F).
set -eu -o pipefail
ATTN=${ATTN:-build/tools/attn}
[ -x "$ATTN" ] || { echo "cpu_decode.sh: no $ATTN; build first (cmake --build build)" >&2; exit 2; }
exec python3 "$(dirname "$0")/decode_bench.py" --cpu --attn "$ATTN" --log "${LOG:-/tmp/cpu_decode.log}" "$@"
