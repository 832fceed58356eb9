#!/usr/bin/env bash
# h35: why a narrow-kernel change is slower. Builds the tool of this tree and
# of the tree in $1 (both 90a only, in parallel), dumps each one's narrow
# bf16 silu kernel (clusters of two) SASS with a count per opcode, then
# samples where its warps stall (ncu source counters) at 8B M, narrow tile
# forced.
#   scripts/probe-narrow-prof.sh BASE_TREE [M]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
base=$1 m=${2:-1024}
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
re='sm90_gemm_glu_kernelI13__nv_bfloat16Li0ELi2ELi0ELi88E'
for t in . "$base"; do
  (cmake -S "$t" -B "$t/build-x" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" \
     -DGATEDMLP_BUILD_TESTS=OFF >"$t/build-x.log" 2>&1 &&
   cmake --build "$t/build-x" -j"$(nproc)" --target gatedmlp_tool >>"$t/build-x.log" 2>&1 || tail -20 "$t/build-x.log") &
done
wait
for t in . "$base"; do
  name=$( [ "$t" = . ] && echo this || basename "$t")
  scripts/sass-of.sh "$t/build-x" "$re" "$out/narrow-$name.sass"
  grep -oE '^ +/\*[0-9a-f]{4,}\*/ +[A-Z][A-Z0-9_.]*' "$out/narrow-$name.sass" | awk '{print $2}' | sed 's/\..*//' |
    sort | uniq -c | sort -rn | head -25 >"$out/opcodes-$name.txt"
  echo "== $name: opcodes"; head -12 "$out/opcodes-$name.txt" | tr '\n' ' '; echo
  OUT="$out/$name" GATEDMLP_SM90_TILE=88 KERNEL="$re" BUILD="$t/build-x" scripts/profile-source.sh "$m" 2>&1 | head -45
done
