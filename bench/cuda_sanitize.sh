#!/usr/bin/env bash
# The CUDA kernels under compute-sanitizer (memcheck, racecheck, synccheck) on the GPU machine, and the
# whole test suite there. Run from the repo root, carrying .device (the cmocka packages:
# ../shared/device/stage.sh):
#
#   STEPS="build ctest memcheck" bash bench/cuda_sanitize.sh      # about 6 minutes
#   STEPS="racecheck synccheck" bash bench/cuda_sanitize.sh       # the build is kept while warm
#   ONLY=hopper_fwd_bias STEPS="memcheck" bash bench/cuda_sanitize.sh   # problems whose name matches
#
# Each problem is one `attn run` call, small enough for the tools' slowdown, chosen to reach one family of
# rows (ATTN_DEBUG names the row each call ran, logged beside the tool's report): the sm_90a forward
# (with and without a bias; a block a tile, and blocks that walk more tiles than fit at once) and
# backward (wgmma, TMA), the mma.sync forward with bias and sinks, TF32, decoding over a paged cache.
# ARCHS=90a-real (the default here) builds the one image that holds every family.
set -u -o pipefail
OUT=${OUT:-/tmp/sanitize-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build ctest memcheck racecheck synccheck}
BUILD=${BUILD:-build-san}
ARCHS=${ARCHS:-90a-real}
t0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }

if [ -d .device/debs ]; then
  for f in .device/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
export ATTN_CL_CACHE_DIR=$PWD/$BUILD/cl-cache

if has build; then
  stamp build
  cmake -S . -B "$BUILD" -DATTN_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >"$OUT/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" >"$OUT/build.log" 2>&1 && echo "build: ok" ||
    { echo "build: FAILED"; grep -m20 error "$OUT/build.log" "$OUT/configure.log"; exit 1; }
fi
ATTN=$BUILD/tools/attn

if has ctest; then
  stamp ctest
  timeout 280 ctest --test-dir "$BUILD" -j8 --timeout 240 --output-on-failure >"$OUT/ctest.log" 2>&1
  echo "ctest: rc $?"
  grep -E "tests passed|FAILED|Failed|\*\*\*|Not Run|Skipped" "$OUT/ctest.log" | head -30
fi

problems=(
  "hopper_bwd_bf16_d128_causal|--dtype bf16 --dim 128 --seqlen 300 --heads 4 --heads-kv 2 --causal --backward"
  "hopper_bwd_f16_d64_gqa|--dtype f16 --dim 64 --seqlen 333 --heads 4 --heads-kv 1 --backward"
  "hopper_bwd_bf16_d96_softcap|--dtype bf16 --dim 96 --seqlen 200 --heads 2 --softcap 30 --backward"
  "hopper_f16_d64_window|--dtype f16 --dim 64 --seqlen 257 --heads 4 --window 50,20 --softcap 30 --backward"
  "hopper_bf16_d96_alibi|--dtype bf16 --dim 96 --seqlen 200 --heads 2 --alibi --backward"
  "hopper_fwd_f16_d256_causal|--dtype f16 --dim 256 --seqlen 300 --heads 2 --causal"
  "hopper_fwd_bias_bf16_d128_causal|--dtype bf16 --dim 128 --seqlen 296 --heads 2 --causal --bias full"
  "hopper_fwd_bias_keys_f16_d256|--dtype f16 --dim 256 --seqlen 200 --heads 2 --bias keys --softcap 30"
  "hopper_fwd_cache_sinks_bf16_d128|--dtype bf16 --dim 128 --seqlen-q 100 --seqlen-k 300 --heads 4 --heads-kv 2 --cache-extra 40 --append --sinks --causal"
  "hopper_fwd_tiles_bf16_d64|--dtype bf16 --dim 64 --seqlen 200 --heads 80 --heads-kv 8 --batch 2"
  "hopper_fwd_rows192_bf16_d64|--dtype bf16 --dim 64 --seqlen 2118 --heads 2 --bias keys"
  "hopper_fwd_keys176_bf16_d128_causal|--dtype bf16 --dim 128 --seqlen-q 130 --seqlen-k 8300 --heads 2 --causal"
  "hopper_fwd_keys208_f16_d64|--dtype f16 --dim 64 --seqlen-q 197 --seqlen-k 600 --heads 2"
  "hopper_fwd_keys208_cache_bf16_d64|--dtype bf16 --dim 64 --seqlen-q 197 --seqlen-k 300 --heads 4 --heads-kv 2 --batch 2 --cache-extra 40 --append"
  "hopper_fwd_tiles_cache_f16_d128|--dtype f16 --dim 128 --seqlen-q 130 --seqlen-k 300 --heads 72 --heads-kv 8 --batch 3 --cache-extra 40 --append --sinks"
  "mma_bf16_bias_sinks|--dtype bf16 --dim 64 --seqlen 190 --heads 2 --bias heads --sinks --backward"
  "tf32_d128_causal|--dtype f32 --tf32 --dim 128 --seqlen 300 --heads 2 --causal"
  "hopper_fwd_tf32_tiles_d64|--dtype f32 --tf32 --dim 64 --seqlen 333 --heads 72 --heads-kv 8 --sinks"
  "f32_d64|--dtype f32 --dim 64 --seqlen 150 --heads 2 --backward"
  "decode_paged_append|--dtype bf16 --dim 128 --seqlen-q 1 --seqlen-k 1000 --heads 8 --heads-kv 2 --batch 2 --cache-extra 100 --page-size 16 --append"
)

CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  has $tool || continue
  stamp $tool
  for p in "${problems[@]}"; do
    name=${p%%|*}
    [[ $name =~ ${ONLY:-.} ]] || continue
    args=${p#*|}
    log="$OUT/$tool-$name.log"
    ATTN_DEBUG=1 timeout 120 "$CS" --tool "$tool" --error-exitcode 3 "$ATTN" run --backend cuda --repeat 1 \
      --check $args >"$log" 2>&1
    rc=$?
    summary=$(grep -o "ERROR SUMMARY: [0-9]* error[s]*\|RACECHECK SUMMARY: [0-9]* hazard[s]*[^\n]*" "$log" | tail -1)
    ran=$(grep -o "ward: [^,]*" "$log" | sort -u | tr '\n' ';')
    printf "%-10s %-30s rc %-3s %-28s %s\n" "$tool" "$name" "$rc" "${summary:-no summary}" "$ran"
  done
done
stamp done
