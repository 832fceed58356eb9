#!/usr/bin/env bash
# Served docs/notes/quantized-decode.md (h66): warps per CTA x chunks per
# k-block of the quantized decode kernel (GATEDMLP_QDECODE=W,U), int4 g64,
# on the decode shapes. Needs the extension built in build-gpu.
set -uo pipefail
cd "$(dirname "$0")/../.."
for wu in ${SWEEP:-2,1 2,2 2,4 4,1 4,2 4,4 8,1 8,2 8,4}; do
  echo "== GATEDMLP_QDECODE=$wu"
  GATEDMLP_QDECODE=$wu PYTHONPATH="$PWD/build-gpu/python" python3 scripts/bench_quant.py --no-baselines \
    --formats "${FORMATS:-int4}" --shapes "${SHAPES:-8b,70b,1024x2816}" --m "${MS:-1,16}" 2>&1 | grep -v "^device"
done
