#!/usr/bin/env bash
# Experiments h44, h45, h48, h51 (docs/notes, the pre-activation's cost and how it is measured): the pre-activation's overhead per layout, this tree against others.
# The pre-activation output's cost, A/B: this tree against one or more
# others (comma-separated; e.g. `git archive <commit> | tar -x -C old`), per
# layout. Each line: the fused call without and with the pre-activation,
# both timed in one run of the bench (trees whose bench predates that
# column: in two runs), and the overhead. The trees alternate within a
# round, so that clock drift hits them alike.
#   scripts/experiments/preact-ab.sh OTHER_TREE[,OTHER_TREE...]
#   env: ROUNDS (2), LAYOUTS ("stacked separate g1 g32 g128"), M (4096), MODEL (8b),
#        BENCH_ARGS (more bench flags, e.g. "--schedule block")
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=0 scripts/experiments/ab-bench.sh "$1" || exit 1
IFS=, read -ra trees <<<".,$1"
# The fused ms column of a bench table line.
fused_col() { awk -F'|' '{split($2, f, " "); print f[1]}'; }
printf "%-10s %-9s %10s %10s %8s\n" tree layout "without" "with" overhead
for r in $(seq "${ROUNDS:-2}"); do
  for l in ${LAYOUTS:-stacked separate g1 g32 g128}; do
    for t in "${trees[@]}"; do
      g="$t/build-ab/tools/gatedmlp"
      # shellcheck disable=SC2086
      line=$("$g" bench --model "${MODEL:-8b}" --m "${M:-4096}" --layout "$l" --preact ${BENCH_ARGS:-} 2>/dev/null |
             grep -E "^(8b|70b|405b|custom) ")
      b=$(fused_col <<<"$line")
      a=$(grep -oE "\(([0-9.]+) ms without\)" <<<"$line" | grep -oE "[0-9.]+" | head -1)
      # shellcheck disable=SC2086
      [ -n "$a" ] || a=$("$g" bench --model "${MODEL:-8b}" --m "${M:-4096}" --layout "$l" ${BENCH_ARGS:-} 2>/dev/null |
                           grep -E "^(8b|70b|405b|custom) " | fused_col)
      printf "%-10s %-9s %10s %10s %7.1f%%\n" "$([ "$t" = . ] && echo this || basename "$t")" "$l" "$a" "$b" \
        "$(awk -v a="$a" -v b="$b" 'BEGIN { print (a > 0 ? 100 * (b / a - 1) : 0) }')"
    done
  done
done
