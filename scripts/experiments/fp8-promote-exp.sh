#!/usr/bin/env bash
# h87 (docs/notes/fp8.md): what the library's kernel adds to the promoting
# loop that the no-memory probe lacks. Builds the library and its Python
# extension for sm_90a once per variant, side by side, each with one timing
# experiment compiled in, then runs fp8-promote-ab.py on each (the all-of-K,
# promoting and block-scaled kernels of the same build, in turn). Y is wrong
# in every variant: timing only.
#   VARIANTS="noloads skip" [AB_ARGS=...] scripts/experiments/fp8-promote-exp.sh
# noloads: the ring filled once, no copies after (GATEDMLP_SM90_EXP_NO_LOADS);
# nosync: noloads, and no stage barriers after the fill (..._NO_SYNC);
# noscales: noloads, and the promoting loop's scales all 1 (..._NO_SCALES);
# skip: no epilogue (GATEDMLP_SM90_EXP_SKIP_EPILOGUE; it made ptxas spill in
# the promoting loop, h87); base: none.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
variants=(${VARIANTS:-noloads skip})
jobs=$(( $(nproc) / ${#variants[@]} ))
for v in "${variants[@]}"; do
  case $v in
    base) flags="" ;;
    noloads) flags="-DGATEDMLP_SM90_EXP_NO_LOADS" ;;
    nosync) flags="-DGATEDMLP_SM90_EXP_NO_LOADS -DGATEDMLP_SM90_EXP_NO_SYNC" ;;
    noscales) flags="-DGATEDMLP_SM90_EXP_NO_LOADS -DGATEDMLP_SM90_EXP_NO_SCALES" ;;
    skip) flags="-DGATEDMLP_SM90_EXP_SKIP_EPILOGUE" ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  (cmake -S . -B build-exp-$v -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_FLAGS="$flags" \
     -DGATEDMLP_BUILD_TESTS=OFF -DGATEDMLP_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" >/tmp/exp-$v.log 2>&1 &&
   cmake --build build-exp-$v -j"$jobs" --target _gatedmlp >>/tmp/exp-$v.log 2>&1 ||
   { tail -20 /tmp/exp-$v.log; echo "build of $v FAILED"; }) &
done
wait
for v in "${variants[@]}"; do
  echo "== $v"
  PYTHONPATH="build-exp-$v/python" python3 scripts/experiments/fp8-promote-ab.py ${AB_ARGS:---model 8b,70b --m 4096 --rounds 3} 2>&1 |
    grep -v accuracy
done
