#!/bin/bash
# The tensor-core kernels on the GPU machine, in one call: build the
# standalone checker (bench/mma_check.cu + cuda/mma_*.cu), run the randomized
# checks against the float64 reference, a small subset under compute-sanitizer
# (memcheck, racecheck), then the benchmark beside PyTorch SDPA.
#   bench/mma_h200.sh [check] [memcheck] [racecheck] [bench] [torch|torchq] [variants] [sass]
# (default: all but variants and sass; torchq = PyTorch at 4k and 8k tokens
# only; variants = rebuild the forward with each tile shape of
# bench/mma_variants.txt, check it, and time it at 4k and 16k tokens)
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
  variants)
    # Each line: a name, then NAME=VALUE build-time defines (no spaces inside).
    while read -r name defs; do
      [ -z "$name" ] && continue
      : >$B/cfg_$name.h
      for d in $defs; do echo "#define ${d%%=*} ${d#*=}" >>$B/cfg_$name.h; done
      (nvcc $FLAGS -Xptxas -v -include $B/cfg_$name.h -c cuda/mma_fwd.cu -o $B/fwd_$name.o >$B/v_$name.log 2>&1 &&
        nvcc $FLAGS -Xptxas -v -include $B/cfg_$name.h -c cuda/mma_bwd.cu -o $B/bwd_$name.o >>$B/v_$name.log 2>&1 &&
        nvcc $FLAGS -o $B/check_$name $B/check.o $B/fwd_$name.o $B/bwd_$name.o >>$B/v_$name.log 2>&1) &
    done < <(grep -v '^#' bench/mma_variants.txt)
    wait
    while read -r name defs; do
      [ -z "$name" ] && continue
      { echo "== $name $defs"
        grep -c 'bytes spill stores' $B/v_$name.log | sed 's/^/kernels: /'
        grep 'spill stores' $B/v_$name.log | grep -v ' 0 bytes spill' | sort | uniq -c
        timeout 60 $B/check_$name check | tail -1
        timeout 90 $B/check_$name fwdbench | tail -n +2; } >>"$OUT/variants.log" 2>&1
    done < <(grep -v '^#' bench/mma_variants.txt)
    ;;
  torch | torchq)
    q=; [ $s = torchq ] && q=quick
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/mma_torch.py $q >"$OUT/torch.log" 2>&1
    ;;
  esac
done
cat "$OUT/gpu.txt"
[ -f "$OUT/torch.log" ] && cat "$OUT/torch.log"
[ -f "$OUT/variants.log" ] && grep -v "^device\|registers" "$OUT/variants.log"
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log"
[ -f "$OUT/check.log" ] && tail -1 "$OUT/check.log"
exit 0
