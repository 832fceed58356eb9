#!/usr/bin/env bash
# Everything a kernel change must pass on a GPU machine, from a clean build:
#   scripts/gpu-check.sh [all|build|smoke|fastpath|test|sanitize|accuracy|bench|bars|portable|resources|layouts|soak|preact|split|python|pyext|quant|down|gather|grouped|fp8test|quantbench|mlpbench|moebench|moeprefill|moeblock|fp8|host|small|dropin] ...
# Steps run in the order given (default: all). Logs and JSON go to $OUT if set,
# else to ./gpu-check-out. The last lines printed are a summary.
# BUILD_TARGETS: build only these targets (default: all). PYTEST_FILES: the
# pyext step's test files or folders (default: tests/python).
# SANITIZE_FILTER: the gtest filter the sanitizers run (default: the random
# suites of every kernel); SANITIZE_TOOLS (default: memcheck racecheck
# synccheck); SANITIZE_CASES: random cases per suite (default 12). ARCHS: the build's CUDA architectures (default "80;90a"; "90a" builds in
# half the time, for a quick `build fastpath` of a Hopper kernel change).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
build=build-gpu
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
[ "${steps[0]}" = all ] && steps=(build smoke test sanitize resources accuracy bench portable bars python)
summary=()
note() { summary+=("$1"); echo "== $1"; }

for step in "${steps[@]}"; do
  case "$step" in
  build)
    rm -rf "$build"
    t0=$(date +%s)
    if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${ARCHS:-80;90a}" -DGATEDMLP_WERROR=ON >"$out/build.log" 2>&1 &&
       cmake --build "$build" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >>"$out/build.log" 2>&1; then
      note "build: ok in $(( $(date +%s) - t0 )) s"
    else
      tail -30 "$out/build.log"; note "build: FAILED"; break
    fi ;;
  smoke)
    # A few cases with a hard time limit: a kernel that hangs (a pipeline
    # barrier never completing) shows up here in seconds, not at ctest's limit.
    timeout 120 "$build/tests/test_gpu" --gtest_filter='GpuApi.PlanNamesThePathAndWhy:GpuApi.BadWorkspaceWritesNothing:GpuFused.EdgeShapes:GpuFused.LargerVectorShapes:GpuFused.FastPathLargeShapes' \
      >"$out/smoke.log" 2>&1
    rc=$?
    tail -25 "$out/smoke.log"
    note "smoke: rc=$rc (124 = timed out); $(grep -E 'PASSED|FAILED' "$out/smoke.log" | tail -1)" ;;
  fastpath)
    # The Hopper kernel's own suites only: a quick check of a kernel change
    # (with ARCHS=90a for the build) before the whole suite.
    "$build/tests/test_gpu" --gtest_filter='GpuFused.FastPath*:GpuActivation.*' >"$out/fastpath.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]" "$out/fastpath.log" | tail -12
    note "fastpath: rc=$rc; $(grep -E 'PASSED|FAILED' "$out/fastpath.log" | tail -1)" ;;
  test)
    # -V keeps every test's output: the random suites print their case counts.
    (cd "$build" && ctest -V -j1 --timeout 600) >"$out/ctest.log" 2>&1
    rc=$?
    grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)" "$out/ctest.log" | tail -15
    note "ctest: rc=$rc; $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
    note "gpu random cases: $(grep -hoE '\[ cases \] [0-9]+' "$out/ctest.log" | awk '{s+=$4} END {print s+0}') passed" ;;
  soak)
    # The random suites with many more cases than ctest runs (SOAK_CASES
    # per suite, default 600): fresh seeds, every variant of each case.
    GATEDMLP_TEST_CASES=${SOAK_CASES:-600} "$build/tests/test_gpu" \
      --gtest_filter='GpuFused.FastPathEvery*:GpuFused.Random*' \
      >"$out/soak.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]" "$out/soak.log" | tail -12
    note "soak: rc=$rc; $(grep -hoE '\[ cases \] [0-9]+' "$out/soak.log" | awk '{s+=$4} END {print s+0}') cases; $(grep -E 'PASSED|FAILED' "$out/soak.log" | tail -1)" ;;
  sanitize)
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      GATEDMLP_TEST_CASES=${SANITIZE_CASES:-12} compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$build/tests/test_gpu" --gtest_filter="${SANITIZE_FILTER:-GpuFused.RandomBf16:GpuFused.RandomFp16:GpuFused.FastPathEvery*:GpuFused.FastPathPreact*:GpuFused.FastPathOddRowBlocks:GpuFused.FastPathTickets:GpuFused.FastPathFallbacks:GpuApi.MisalignedPointersStillCorrect:GpuDecode.Random*:GpuDecode.EveryLayout*:GpuQuant.Random*:GpuDown.Random*:GpuGather.*:GpuGrouped.Random*:GpuGrouped.Bad*:GpuFp8.Random*:GpuFp8.Bad*:GpuFp8.Fp8Output*}" \
        >"$out/sanitize_$tool.log" 2>&1
      rc=$?
      note "compute-sanitizer $tool: rc=$rc, $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize_$tool.log" | tail -1)"
    done ;;
  resources)
    cuobjdump --dump-resource-usage "$build/src/libgatedmlp.a" 2>/dev/null | grep -E "Function|REG|STACK|SHARED" >"$out/resources.txt"
    for k in sm80_gemm_glu_kernel sm90_gemm_glu_kernel sm90_gemm_glu_pingpong_kernel; do
      echo "   $k:"
      grep -A1 "$k" "$out/resources.txt" | grep -oE "REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+ LOCAL:[0-9]+" | sort | uniq -c | sed 's/^/   /'
    done
    cuobjdump -sass -arch sm_90a "$build/src/libgatedmlp.a" >"$build/sass_sm90a.txt" 2>/dev/null
    # Which kernels touch local memory, and the lines around each spill store.
    awk '/Function :/ {fn=$3} /[ \t](LDL|STL)[ .]/ {n[fn]++} END {for (f in n) print "   local memory:", n[f], f}' "$build/sass_sm90a.txt"
    grep -B3 -A1 -E '\bSTL' "$build/sass_sm90a.txt" | head -60 >"$out/spills.txt"
    note "sm_90a SASS: $(grep -cE '\bHMMA' "$build/sass_sm90a.txt") HMMA (portable), $(grep -c HGMMA "$build/sass_sm90a.txt") HGMMA (Hopper), $(grep -cE '\b(LDL|STL)' "$build/sass_sm90a.txt") local loads/stores" ;;
  accuracy)
    "$build/tools/gatedmlp" accuracy --json "$out/accuracy.json" 2>&1 | tee "$out/accuracy.txt" | tail -15
    note "accuracy: rc=${PIPESTATUS[0]} (table in accuracy.txt)" ;;
  bench)
    "$build/tools/gatedmlp" bench --model "${GATEDMLP_BENCH_MODEL:-8b}" --json "$out/bench.json" 2>"$out/bench.err" | tee "$out/bench.txt"
    note "bench: rc=${PIPESTATUS[0]} (table in bench.txt)" ;;
  portable)
    # The portable kernel's target (issue: at least 0.50 of cuBLAS GEMM alone
    # on the 8B shapes at M >= 1024), on a Hopper GPU through --path portable.
    "$build/tools/gatedmlp" bench --path portable --m 1024,4096,16384,65536 --json "$out/portable.json" 2>"$out/portable.err" |
      grep -E "^(model|8b) " | cut -c1-100 | tee "$out/portable.txt"
    note "portable: table in portable.txt" ;;
  bars)
    # The Hopper issue's bars, each ratio from one run: the three models at
    # M = 1024/4096/16384, small M, many rows with small weights, and every
    # layout (and the pre-activation output) against stacked on the 8B M=4096
    # shape.
    g="$build/tools/gatedmlp"
    { "$g" bench --model all --m 1024,4096,16384
      "$g" bench --m 64,128,256,512
      "$g" bench --m 512 --k 1024 --u 4096
      for l in separate g1 g8 g16 g32 g64 g128 g256; do "$g" bench --m 4096 --layout "$l"; done
      "$g" bench --m 4096 --layout g32 --first up
      for l in stacked g1; do "$g" bench --m 4096 --layout "$l" --preact; done
    } 2>"$out/bars.err" | grep -E "^(model|8b|70b|405b|custom) " | cut -c1-170 | tee "$out/bars.txt"
    note "bars: table in bars.txt" ;;
  layouts)
    # Every interleave block against stacked on a model's shape
    # (LAYOUT_MODEL, default 8b; M in LAYOUT_MS, default 4096), as the
    # library picks and with each GATEDMLP_SM90_TILE in LAYOUT_TILES forced
    # (default: 128), ROUNDS times.
    g="$build/tools/gatedmlp"
    lm=${LAYOUT_MODEL:-8b}
    for r in $(seq "${ROUNDS:-2}"); do
      for l in ${LAYOUTS:-stacked g16 g32 g64 g128 g256}; do
        for t in - ${LAYOUT_TILES:-128}; do
          if [ "$t" = - ]; then "$g" bench --model "$lm" --m "${LAYOUT_MS:-4096}" --layout "$l"
          else GATEDMLP_SM90_TILE=$t "$g" bench --model "$lm" --m "${LAYOUT_MS:-4096}" --layout "$l"; fi |
            sed "s/^$lm /$lm-$l-$([ "$t" = - ] && echo pick || echo t$t) /"
        done
      done
    done 2>"$out/layouts.err" | grep -E "^$lm-" | cut -c1-170 | tee "$out/layouts.txt"
    note "layouts: table in layouts.txt" ;;
  preact)
    # The pre-activation output's cost per layout (8B, M = 4096; the bench
    # times the fused call with and without it in the same run and prints
    # the difference first in the last column: "preact +x.x%"), through TMA
    # stores, then with GATEDMLP_SM90_PRE_TMA=0 (stored from registers), and
    # memcheck on the fast path's pre-activation tests. PREACT_LAYOUTS:
    # which layouts (default: stacked separate g1 g8 g16 g32 g128).
    g="$build/tools/gatedmlp"
    { for l in ${PREACT_LAYOUTS:-stacked separate g1 g8 g16 g32 g128}; do
        "$g" bench --m 4096 --layout "$l" --preact | sed "s/^8b /8b-$l /"
        GATEDMLP_SM90_PRE_TMA=0 "$g" bench --m 4096 --layout "$l" --preact | sed "s/^8b /8b-$l-reg /"; done
    } 2>"$out/preact.err" | grep -E "^(model|8b-[a-z0-9-]*|custom) " | cut -c1-170 | tee "$out/preact.txt"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/test_gpu" \
      --gtest_filter='GpuFused.FastPathPreact*' >"$out/sanitize_preact.log" 2>&1
    note "preact: table in preact.txt; memcheck rc=$?, $(grep -E "ERROR SUMMARY" "$out/sanitize_preact.log" | tail -1)" ;;
  split)
    # The Hopper split tail on and off (GATEDMLP_SM90_SPLIT_TAIL), each run
    # with cuBLAS in the same run: the shapes whose last wave is partial.
    g="$build/tools/gatedmlp"
    # SPLIT_VARIANTS: "TAIL:WAVES" pairs (GATEDMLP_SM90_SPLIT_TAIL,
    # GATEDMLP_SM90_SPLIT_WAVES; 0 = the library's choice); default: off,
    # then the default.
    { for v in ${SPLIT_VARIANTS:-0:0 1:0}; do
        echo "-- GATEDMLP_SM90_SPLIT_TAIL=${v%%:*} GATEDMLP_SM90_SPLIT_WAVES=${v##*:}"
        export GATEDMLP_SM90_SPLIT_TAIL=${v%%:*} GATEDMLP_SM90_SPLIT_WAVES=${v##*:}
        "$g" bench --m ${SPLIT_MS:-1,64,128,256,512,1024,4096,16384}
        "$g" bench --model 70b --m 1024,4096
        "$g" bench --m 512 --k 1024 --u 4096
      done
      unset GATEDMLP_SM90_SPLIT_TAIL GATEDMLP_SM90_SPLIT_WAVES
    } 2>"$out/split.err" | grep -E "^(--|model|8b|70b|405b|custom) " | cut -c1-140 | tee "$out/split.txt"
    note "split: table in split.txt" ;;
  python)
    # Packaging as a user would (offline: the build tools are already there), then the tests and the binding bench.
    python3 -m pip install . --no-build-isolation -q >"$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; note "python: pip install FAILED"; continue; }
    (cd /tmp && python3 -m pytest "$OLDPWD/tests/python" -q -p no:cacheprovider) >"$out/pytest.log" 2>&1
    rc=$?
    tail -5 "$out/pytest.log"
    note "pytest: rc=$rc; $(tail -1 "$out/pytest.log")"
    python3 scripts/bench_python.py 2>&1 | tee "$out/bench_python.txt" | tail -20
    note "bench_python: rc=${PIPESTATUS[0]} (table in bench_python.txt)" ;;
  pyext)
    # The Python extension in the same build tree (no second build of the
    # library, as pip install would make), then the Python tests against it.
    # Wheels in .whl/ (test-time extras such as mlx, for machines without an
    # index) go to a private target first, so the MLX comparisons run.
    pypath="$PWD/$build/python"
    if ls .whl/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PWD/$build/extras" .whl/*.whl >>"$out/pip.log" 2>&1 &&
        pypath="$pypath:$PWD/$build/extras"
    fi
    if cmake -S . -B "$build" -DGATEDMLP_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" >>"$out/build.log" 2>&1 &&
       cmake --build "$build" --target _gatedmlp -j"$(nproc)" >>"$out/build.log" 2>&1; then
      (cd /tmp && PYTHONPATH="$pypath" python3 -m pytest $(for f in ${PYTEST_FILES:-tests/python}; do echo "$OLDPWD/$f"; done) -q -p no:cacheprovider -rs) >"$out/pytest.log" 2>&1
      rc=$?
      grep -E "FAILED|Error" "$out/pytest.log" | head -20
      grep -E "^SKIPPED" "$out/pytest.log" | sed -E 's/^SKIPPED \[[0-9]+\] //' | sort | uniq -c | sort -rn | head -8
      note "pytest (build tree): rc=$rc; $(tail -1 "$out/pytest.log")"
    else
      tail -20 "$out/build.log"; note "pyext: build FAILED"
    fi ;;
  quant)
    # The quantized decode kernel's suites only (the whole suite runs them too).
    "$build/tests/test_gpu" --gtest_filter='GpuQuant.*' >"$out/quant.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]|Failure|error" "$out/quant.log" | head -30
    note "quant: rc=$rc; $(grep -E 'PASSED|FAILED' "$out/quant.log" | tail -1)" ;;
  down)
    # The down projection's suites only (the whole suite runs them too).
    "$build/tests/test_gpu" --gtest_filter='GpuDown.*' >"$out/down.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]|Failure|error" "$out/down.log" | head -30
    note "down: rc=$rc; $(grep -E 'PASSED|FAILED' "$out/down.log" | tail -1)" ;;
  gather)
    # The gathered (MoE) suites only (the whole suite runs them too).
    "$build/tests/test_gpu" --gtest_filter='GpuGather.*' >"$out/gather.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]|Failure|error" "$out/gather.log" | head -30
    note "gather: rc=$rc; $(grep -E 'PASSED|FAILED' "$out/gather.log" | tail -1)" ;;
  grouped)
    # The grouped (MoE prefill) suites only: rows sorted by expert, on the
    # Hopper kernel's grouped form (the whole suite runs them too).
    "$build/tests/test_gpu" --gtest_filter='GpuGrouped.*' >"$out/grouped.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]|Failure|error" "$out/grouped.log" | head -30
    note "grouped: rc=$rc; $(grep -E 'PASSED|FAILED' "$out/grouped.log" | tail -1)" ;;
  fp8test)
    # The FP8 (e4m3) suites only: the Hopper kernel's FP8 form (the whole suite runs them too).
    "$build/tests/test_gpu" --gtest_filter='GpuFp8.*' >"$out/fp8test.log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED) |cases \]|error \]|Failure|error" "$out/fp8test.log" | head -30
    note "fp8test: rc=$rc; $(grep -E 'PASSED|FAILED' "$out/fp8test.log" | tail -1)" ;;
  moebench)
    # Gathered gate/up decode (needs the pyext step first): the MoE issue's
    # read-rate bar on the distinct experts' bytes, against grouped_mm + GLU.
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_moe.py ${MOE_ARGS:-} --json "$out/moe_bench.json" 2>&1 |
      tee "$out/moe_bench.txt" | tail -40
    note "moebench: rc=${PIPESTATUS[0]} (table in moe_bench.txt)" ;;
  moeprefill)
    # Grouped gate/up + GLU on rows sorted by expert (needs the pyext step
    # first): uniform and skewed routings against torch._grouped_mm alone,
    # + GLU eager and compiled; the bar 1.1x the faster grouped_mm + GLU.
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_moe.py --mode prefill ${MOE_PREFILL_ARGS:-} --json "$out/moe_prefill.json" 2>&1 |
      tee "$out/moe_prefill.txt" | tail -40
    note "moeprefill: rc=${PIPESTATUS[0]} (table in moe_prefill.txt)" ;;
  moeblock)
    # The whole MoE experts block (needs the pyext step first): MoEExperts
    # and moe_mlp against transformers' experts modules, eager and compiled.
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_moe.py --mode block ${MOE_BLOCK_ARGS:-} --json "$out/moe_block.json" 2>&1 |
      tee "$out/moe_block.txt" | tail -40
    note "moeblock: rc=${PIPESTATUS[0]} (table in moe_block.txt)" ;;
  fp8)
    # FP8 activations on the gate/up kernel (needs the pyext step first):
    # fp8_gate_up, per-tensor and row-wise scales, against bf16 gatedmlp and
    # torch._scaled_mm alone and + GLU eager and compiled at prefill sizes
    # (the bars 1.75x bf16 at M >= 2048, 1.0x _scaled_mm at M >= 1024), and
    # the accuracy table. FP8_BENCH_ARGS: extra args (--model, --m, ...).
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_fp8.py ${FP8_BENCH_ARGS:-} --json "$out/fp8_bench.json" 2>&1 |
      tee "$out/fp8_bench.txt" | tail -60
    note "fp8: rc=${PIPESTATUS[0]} (tables in fp8_bench.txt)" ;;
  mlpbench)
    # Whole-MLP decode (needs the pyext step first): gate/up + down from
    # bf16 and int4 weights against the PyTorch chains and the roofline.
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_mlp.py ${MLP_ARGS:-} --json "$out/mlp_bench.json" 2>&1 |
      tee "$out/mlp_bench.txt" | tail -40
    note "mlpbench: rc=${PIPESTATUS[0]} (table in mlp_bench.txt)" ;;
  quantbench)
    # The quantized-weights bars (needs the pyext step first): quantized
    # gate/up against bf16 gatedmlp, tinygemm int4 and the read roofline.
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_quant.py ${QUANT_ARGS:-} --json "$out/quant_bench.json" 2>&1 |
      tee "$out/quant_bench.txt" | tail -40
    note "quantbench: rc=${PIPESTATUS[0]} (table in quant_bench.txt)" ;;
  host)
    # Host time per call of run() against an empty kernel launch (the drop-in issue's C++ bar).
    "$build/tools/gatedmlp" bench --host 2>&1 | tee "$out/host.txt" | tail -25
    note "host: rc=${PIPESTATUS[0]} (table in host.txt)" ;;
  small)
    # Decode shapes (M = 1 ... 16) in CUDA-graph replay, and 8B at small M.
    g="$build/tools/gatedmlp"
    { "$g" bench --model small; "$g" bench --graph --m 1,4,16; } 2>"$out/small.err" | tee "$out/small.txt" | tail -40
    note "small: table in small.txt" ;;
  dropin)
    # The drop-in's bars from Python (needs the pyext step first): host cost
    # per entry point, patched models against unpatched, small shapes.
    PYTHONPATH="$PWD/$build/python" python3 scripts/bench_dropin.py ${DROPIN_ARGS:-} --json "$out/dropin.json" 2>&1 |
      tee "$out/dropin.txt" | tail -80
    note "dropin: rc=${PIPESTATUS[0]} (tables in dropin.txt)" ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
# The commit, and how many tracked files differ from it: a copy of a working
# tree can carry an older .git than its files (GATEDMLP_GIT_COMMIT names the
# tree's commit when the caller knows it).
changed=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)
echo "commit: ${GATEDMLP_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}$([ "${GATEDMLP_GIT_COMMIT:-}" = "" ] && [ "$changed" -gt 0 ] && echo " + $changed tracked files changed since it")"
printf '%s\n' "${summary[@]}"
