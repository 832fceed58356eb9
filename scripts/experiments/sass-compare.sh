#!/usr/bin/env bash
# Experiments h35, h40 (docs/notes, the narrow tile's column sets; the sigmoid without subnormal fix-ups): a kernel's SASS opcode mix against another tree's.
# h35: a kernel's SASS against another tree's. Builds the tool of this tree
# and of the tree in $1 (scripts/experiments/ab-bench.sh with ROUNDS=0) and dumps each
# one's kernel matching KERNEL (default: the narrow bf16 silu kernel with
# clusters of two) with its size and a count per opcode (scripts/sass-of.sh).
#   [KERNEL=regex] scripts/experiments/sass-compare.sh OTHER_TREE
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
base=$1
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
re=${KERNEL:-sm90_gemm_glu_kernelI13__nv_bfloat16Li0ELi2ELi0ELi88E}
ROUNDS=0 scripts/experiments/ab-bench.sh "$base" || exit 1  # builds both tools, times nothing
for t in . "$base"; do
  name=$( [ "$t" = . ] && echo this || basename "$t")
  scripts/sass-of.sh "$t/build-ab" "$re" "$out/kernel-$name.sass"
  grep -oE '^ +/\*[0-9a-f]{4,}\*/ +[A-Z][A-Z0-9_.]*' "$out/kernel-$name.sass" | awk '{print $2}' | sed 's/\..*//' |
    sort | uniq -c | sort -rn | head -25 >"$out/opcodes-$name.txt"
  echo "== $name: opcodes"; head -12 "$out/opcodes-$name.txt" | tr '\n' ' '; echo
done
