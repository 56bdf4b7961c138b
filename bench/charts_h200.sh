#!/usr/bin/env bash
# The charts and tables of attn beside PyTorch on the H200 machine, in one
# call from the project root, with the program already built in $BUILD:
#
#   BUILD=build-h200 OUT=/tmp/attn-out bash bench/charts_h200.sh
#
# attn bench times the CUDA backend (bf16 and f16, head dims 64 and 128,
# N = 1k to 16k with B*N = 16384 and H*d = 2048, no mask and causal, forward
# and backward; and decoding steps, bf16, 32 query heads over 8 KV heads of
# 128, over 8k, 32k and 128k keys with B*keys = 131072) and the CPU backend
# (f32 and bf16, a smaller sweep: N = 512 to 4k, B*N = 8192); bench/peer.py
# times torch's flash and cuDNN kernels, and its CPU kernel, over the same
# rows (--like). Everything lands under $OUT: the JSON lines (cuda.jsonl,
# cuda-peer.jsonl, decode.jsonl, decode-peer.jsonl, cpu.jsonl,
# cpu-peer.jsonl), tables.md (bench/table.py) and, where matplotlib is
# installed, charts/*.png (bench/plot.py); without it, plot on another
# machine from the fetched JSON lines (the command is printed).
#
# Each step has a time limit (STEP_S below, about 8 minutes in all; a sweep
# that meets it keeps the rows written so far), and the per-row budget is
# short, so the whole runs well within a 10-minute call. THREADS (default:
# every CPU) is both attn's OpenMP threads and torch's. The sweep lists can
# be narrowed for a quick look: CUDA_SEQLENS, CPU_SEQLENS, DECODE_KEYS,
# BUDGET (seconds per row). Without a CUDA device the CUDA steps are skipped,
# said so.
set -u -o pipefail
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/attn-out}
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-$(nproc)}
BUDGET=${BUDGET:-0.25}
CUDA_SEQLENS=${CUDA_SEQLENS:-1024,2048,4096,8192,16384}
CPU_SEQLENS=${CPU_SEQLENS:-512,1024,2048,4096}
DECODE_KEYS=${DECODE_KEYS:-8192,32768,131072}
ATTN=$BUILD/tools/attn
export ATTN_CL_CACHE_DIR=${ATTN_CL_CACHE_DIR:-/tmp/attn-cl-cache} OMP_NUM_THREADS=$THREADS PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }

if [ ! -x "$ATTN" ]; then
  echo "no $ATTN: build the program first, e.g."
  echo "  cmake -S . -B $BUILD -DCMAKE_CUDA_ARCHITECTURES=90a-real && cmake --build $BUILD -j16 --target attn_cli"
  exit 1
fi
"$ATTN" info | sed -n '1,12p'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader 2>/dev/null
have_torch=1
"$PYTHON" -c "import torch" 2>/dev/null || { have_torch=0; echo "PyTorch is not installed: no peer rows"; }

# step NAME SECONDS COMMAND...: the command under its time limit, said when it meets it.
step() {
  local name=$1 limit=$2
  shift 2
  stamp "$name"
  timeout "$limit" "$@"
  local rc=$?
  [ $rc -eq 124 ] && echo "$name: stopped at its limit of $limit s (the rows written so far are kept)"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$name: exit status $rc"
  return 0
}

COMMON=(--budget "$BUDGET" --repeat 30 --format json)
if "$ATTN" info | grep -q "^    cuda:0 "; then
  step "cuda sweep" 110 "$ATTN" bench --backends cuda --dtypes bf16,f16 --dims 64,128 \
    --seqlens "$CUDA_SEQLENS" --masks none,causal --passes fwd,bwd "${COMMON[@]}" --output "$OUT/cuda.jsonl"
  step "cuda decoding" 30 "$ATTN" bench --backends cuda --dtypes bf16 --dims 128 --seqlen-k "$DECODE_KEYS" \
    --tokens 131072 --heads 32 --heads-kv 8 --masks none "${COMMON[@]}" --output "$OUT/decode.jsonl"
  if [ $have_torch = 1 ]; then
    step "cuda peers" 110 "$PYTHON" bench/peer.py --like "$OUT/cuda.jsonl" --budget "$BUDGET" --repeat 30 \
      --output "$OUT/cuda-peer.jsonl"
    step "decoding peers" 30 "$PYTHON" bench/peer.py --like "$OUT/decode.jsonl" --budget "$BUDGET" \
      --repeat 30 --output "$OUT/decode-peer.jsonl"
  fi
else
  echo "no CUDA device: the CUDA steps are skipped"
fi
step "cpu sweep" 100 "$ATTN" bench --backends cpu --dtypes f32,bf16 --dims 64,128 --seqlens "$CPU_SEQLENS" \
  --tokens 8192 --masks none,causal --passes fwd,bwd "${COMMON[@]}" --output "$OUT/cpu.jsonl"
if [ $have_torch = 1 ]; then
  step "cpu peers" 100 "$PYTHON" bench/peer.py --like "$OUT/cpu.jsonl" --threads "$THREADS" \
    --budget "$BUDGET" --repeat 30 --output "$OUT/cpu-peer.jsonl"
fi

stamp "tables and charts"
rows=()
for f in "$OUT"/{cuda,cuda-peer,decode,decode-peer,cpu,cpu-peer}.jsonl; do
  [ -s "$f" ] && rows+=("$f")
done
if [ ${#rows[@]} -eq 0 ]; then
  echo "no rows were written"
  exit 1
fi
"$PYTHON" bench/table.py "${rows[@]}" --output "$OUT/tables.md"
if "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  "$PYTHON" bench/plot.py "${rows[@]}" --outdir "$OUT/charts"
else
  echo "matplotlib is not installed here: no charts. Where it is, from the fetched files:"
  echo "  python3 bench/plot.py $(cd "$OUT" && ls -1 *.jsonl | tr '\n' ' ')--outdir charts"
fi
stamp done
cat "$OUT/tables.md"
