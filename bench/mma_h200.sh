#!/bin/bash
# The tensor-core kernels on the GPU machine, in one call: build the
# standalone checker (bench/mma_check.cu + cuda/mma_*.cu), run the randomized
# checks against the float64 reference, a small subset under compute-sanitizer
# (memcheck, racecheck), then the benchmark beside PyTorch SDPA.
#   bench/mma_h200.sh [check] [memcheck] [racecheck] [bench] [torch|torchq] [sass]
# (default: all but sass; torchq = PyTorch at 4k and 8k tokens only)
# Logs go to $OUT (or /tmp/mma_out); a short table is printed last.
set -u
OUT=${OUT:-/tmp/mma_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
steps=${*:-check memcheck racecheck bench torch}
ARCH=${MMA_ARCH:-"-gencode arch=compute_90,code=sm_90"}
FLAGS="-std=c++17 -O3 -I include -I src -I cuda $ARCH -Xcompiler -fopenmp"
B=/tmp/mma_build
mkdir -p $B
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >"$OUT/gpu.txt" 2>&1
t0=$(date +%s)
nvcc $FLAGS -Xptxas -v -c cuda/mma_fwd.cu -o $B/fwd.o >$B/fwd.log 2>&1 &
nvcc $FLAGS -Xptxas -v -c cuda/mma_bwd.cu -o $B/bwd.o >$B/bwd.log 2>&1 &
nvcc $FLAGS -c bench/mma_check.cu -o $B/check.o >$B/check.log 2>&1 &
wait
cat $B/*.log >"$OUT/build.log"
nvcc $FLAGS -o $B/mma_check $B/check.o $B/fwd.o $B/bwd.o >>"$OUT/build.log" 2>&1 || {
  tail -30 "$OUT/build.log"
  exit 1
}
echo "build: $(($(date +%s) - t0)) s"
for s in $steps; do
  case $s in
  check) timeout 150 $B/mma_check check 2>&1 | tee "$OUT/check.log" | grep -v " ok$" ;;
  memcheck | racecheck)
    timeout 90 compute-sanitizer --tool $s $B/mma_check san >"$OUT/$s.log" 2>&1
    echo "$s rc $?: $(grep -E 'SUMMARY|PASS|FAIL' "$OUT/$s.log" | tr '\n' ' ')"
    ;;
  bench) timeout 100 $B/mma_check bench >"$OUT/bench.log" 2>&1 ;;
  sass) for o in fwd bwd; do cuobjdump -sass $B/$o.o; done | gzip >"$OUT/mma.sass.gz" ;;
  torch | torchq)
    q=; [ $s = torchq ] && q=quick
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/mma_torch.py $q >"$OUT/torch.log" 2>&1
    ;;
  esac
done
cat "$OUT/gpu.txt"
[ -f "$OUT/torch.log" ] && cat "$OUT/torch.log"
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log"
[ -f "$OUT/check.log" ] && tail -1 "$OUT/check.log"
exit 0
