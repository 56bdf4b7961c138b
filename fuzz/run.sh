#!/usr/bin/env bash
# Builds the libFuzzer targets into build-fuzz/ (clang, ASan + UBSan, the CPU
# backend only) and runs each for SECONDS (default 30) over its corpus in
# fuzz/corpus/<target>. Exits non-zero when any target finds a crash, a
# sanitizer report, a broken invariant, a hang, a leak or a huge allocation;
# the input is then in build-fuzz/findings/.
#
# Inputs a run finds interesting go to build-fuzz/corpus/<target>, not into
# the repository. To keep them, minimize into the repository's corpus:
#   build-fuzz/fuzz/<target> -merge=1 fuzz/corpus/<target> build-fuzz/corpus/<target>
# The hand-made seeds (seed_*) come from fuzz/golden_seeds.py and
# fuzz/api_seeds.py; FUZZ_API_TRACE=1 build-fuzz/fuzz/fuzz_api INPUT shows
# the status and message of each call an input makes.
set -euo pipefail
secs=${1:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build-fuzz

# No CUDA (nvcc takes no -fsanitize), no OpenCL: fuzz_backend's expected
# outcomes assume the CPU backend alone, and PoCL would slow every context.
CC=clang cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_FUZZ=ON \
  -DATTN_WITH_CUDA=OFF -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_api fuzz_golden fuzz_backend

# One OpenMP thread: the CPU passes' cost is not what is under test, and the
# runs then leave the other cores alone.
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build/findings"
failed=()
for target in fuzz_backend fuzz_golden fuzz_api; do
  mkdir -p "$build/corpus/$target"
  dict=()
  [ "$target" = fuzz_golden ] && dict=(-dict="$here/fuzz/golden.dict")
  echo "== $target, ${secs} s"
  # -malloc_limit_mb: no single allocation above 256 MiB (the reader must
  # refuse absurd sizes before allocating); -timeout: an input taking 25 s
  # is a hang.
  if ! "$build/fuzz/$target" "$build/corpus/$target" "$here/fuzz/corpus/$target" "${dict[@]}" \
    -max_total_time="$secs" -timeout=25 -malloc_limit_mb=256 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$target-" >"$build/$target.log" 2>&1; then
    failed+=("$target")
    tail -n 60 "$build/$target.log"
  fi
  grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units" "$build/$target.log" || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (inputs in $build/findings/)"
  exit 1
fi
echo "fuzz: no findings"
