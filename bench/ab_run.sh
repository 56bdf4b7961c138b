#!/usr/bin/env bash
# Builds of attn side by side: each problem's medians from every build, alternated, one process a
# call, for A/B runs on the GPU machine, where a call has minutes: each line prints as it completes,
# with the seconds so far, and no problem starts once BUDGET_S have passed (so a call's limit never
# loses what was measured). From the project root:
#
#   BINS="build-A/tools/attn build-B/tools/attn" BACKEND=opencl bash bench/ab_run.sh \
#     "--dtype bf16 --batch 2 --seqlen 4096 --heads 16 --dim 128" \
#     "--dtype bf16 --batch 2 --seqlen 4096 --heads 16 --dim 128 --bias full"
#
# Each argument is one problem in `attn run`'s options. Knobs: BINS (the builds' attn programs, named
# A, B, C, .. in that order), BACKEND (cuda), ROUNDS (1), REPEAT (10), BUDGET_S (300), BACKWARD (1:
# the backward's median too), CACHE (/tmp/ab-cache: each build's OpenCL programs under CACHE/A, ..).
# A line a problem and round, ms (medians of REPEAT calls), "-" where a build printed none, followed
# by that build's last line of output:
#   r1 --dtype bf16 .. --dim 128 :: A 2.416 | B 2.010 (37 s)
set -u -o pipefail
read -r -a bins <<<"${BINS:?BINS: the attn programs of the builds, space-separated}"
BACKEND=${BACKEND:-cuda}
ROUNDS=${ROUNDS:-1}
REPEAT=${REPEAT:-10}
BUDGET_S=${BUDGET_S:-300}
BACKWARD=${BACKWARD:-0}
CACHE=${CACHE:-/tmp/ab-cache}
[ $# -gt 0 ] || { echo "ab_run.sh: no problem given (one argument a problem)" >&2; exit 2; }
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "ab_run.sh: $b is not an executable attn program" >&2; exit 2; }
done
labels=(A B C D E F G H)
[ "${#bins[@]}" -le "${#labels[@]}" ] || { echo "ab_run.sh: at most ${#labels[@]} builds" >&2; exit 2; }
t0=$(date +%s)
extra=()
[ "$BACKWARD" = 1 ] && extra=(--backward)

# One build's medians for one problem: "fwd" or "fwd/bwd", else "-" and its last line.
one() {
  local label=$1 bin=$2 problem=$3 out fwd bwd
  # shellcheck disable=SC2086 # the problem is a list of options
  out=$(ATTN_CL_CACHE_DIR="$CACHE/$label" "$bin" run --backend "$BACKEND" --no-check \
    --repeat "$REPEAT" "${extra[@]}" $problem 2>&1)
  fwd=$(grep -m1 -oE "^ *forward +[0-9.]+ ms" <<<"$out" | grep -oE "[0-9.]+")
  bwd=$(grep -m1 -oE "^ *backward +[0-9.]+ ms" <<<"$out" | grep -oE "[0-9.]+")
  if [ -z "$fwd" ] || { [ "$BACKWARD" = 1 ] && [ -z "$bwd" ]; }; then
    echo "- ($(tail -n 1 <<<"$out"))"
  elif [ "$BACKWARD" = 1 ]; then
    echo "$fwd/$bwd"
  else
    echo "$fwd"
  fi
}

for round in $(seq "$ROUNDS"); do
  for problem in "$@"; do
    if [ $(($(date +%s) - t0)) -ge "$BUDGET_S" ]; then
      echo "stopped: $BUDGET_S s spent before r$round $problem"
      exit 0
    fi
    line="r$round $problem ::"
    for i in "${!bins[@]}"; do
      [ "$i" -gt 0 ] && line+=" |"
      line+=" ${labels[$i]} $(one "${labels[$i]}" "${bins[$i]}" "$problem")"
    done
    echo "$line ($(($(date +%s) - t0)) s)"
  done
done
