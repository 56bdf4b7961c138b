#!/usr/bin/env bash
# Prefill with an additive bias beside the same problem without one (the inference-path issue's
# target: 0.85x), in one process per call, alternated, ROUNDS times. From the project root:
#
#   ATTN=build-h200/tools/attn BACKEND=cuda bash bench/bias_prefill.sh
#
# Prints one line per problem and round: the forward's median time with no bias, a full bias
# [B, H, N, N], one per head broadcast over the batch [B, 1, N, N] ("heads") and one over the keys
# alone [B, 1, 1, N] ("keys"), each bias of the data's dtype.
set -u -o pipefail
ATTN=${ATTN:-build/tools/attn}
BACKEND=${BACKEND:-cuda}
ROUNDS=${ROUNDS:-2}
REPEAT=${REPEAT:-20}
problems=(
  "--dtype bf16 --batch 2 --seqlen 4096 --heads 16 --dim 128"
  "--dtype bf16 --batch 2 --seqlen 4096 --heads 32 --dim 64"
  "--dtype bf16 --batch 2 --seqlen 4096 --heads 16 --dim 128 --causal"
  "--dtype f16 --batch 2 --seqlen 4096 --heads 16 --dim 128"
)
run() {
  "$ATTN" run --backend "$BACKEND" --repeat "$REPEAT" --no-check "$@" 2>&1 |
    grep -oE "forward +[0-9.]+ ms" | head -1 | grep -oE "[0-9.]+ ms"
}
for round in $(seq "$ROUNDS"); do
  for p in "${problems[@]}"; do
    # shellcheck disable=SC2086
    echo "$p :: none $(run $p) | full $(run $p --bias full) | heads $(run $p --bias heads) | keys $(run $p --bias keys)"
  done
done
