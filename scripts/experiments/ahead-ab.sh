#!/usr/bin/env bash
# h97 (docs/notes/quantized-decode.md): the tiled int4 kernels with 1, 2 or 3
# k-blocks requested ahead per warp (GATEDMLP_QDECODE_AHEAD), timed in turn
# (ABA) in one session: the whole MLP (bench_mlp.py), gate/up alone
# (bench_quant.py) and gathered experts (bench_moe.py).
# Needs `scripts/gpu-check.sh build pyext` first (build-gpu/python).
#   AHEADS="0 1 2 3 1" (0: the plan's rule)  MS=1,4,16  BENCHES="mlp quant moe"
#   MODELS=gpt-oss-20b (moe only; default: bench_moe.py's)  MOE_ARGS="--shape NAME=E,TOPK,H,I" (moe only)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD/build-gpu/python"
ms=${MS:-1,4,16}
for bench in ${BENCHES:-mlp quant moe}; do
  for a in ${AHEADS:-1 2 3 1}; do
    echo "-- $bench, GATEDMLP_QDECODE_AHEAD=$a (0: the rule)" | tee -a "$out/ahead-$bench.txt"
    knob=(env GATEDMLP_QDECODE_AHEAD="$a")
    [ "$a" = 0 ] && knob=(env -u GATEDMLP_QDECODE_AHEAD)
    case "$bench" in
    mlp) "${knob[@]}" python3 scripts/bench_mlp.py --impls gatedmlp_int4t --m "$ms" 2>&1 | grep -E "gatedmlp_int4t" ;;
    quant) "${knob[@]}" python3 scripts/bench_quant.py --formats int4t --no-baselines --m "$ms" 2>&1 | grep -E "int4t " ;;
    moe) "${knob[@]}" python3 scripts/bench_moe.py --formats int4t --t "$ms" ${MODELS:+--models "$MODELS"} ${MOE_ARGS:-} 2>&1 | grep -E "int4t T=" ;;
    esac | tee -a "$out/ahead-$bench.txt"
  done
done
