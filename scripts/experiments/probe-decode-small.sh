#!/usr/bin/env bash
# Experiment h75 (docs/notes/drop-in-and-decode.md, the small shapes' bar): where the decode kernel's time
# goes on the `small` model set, against the cuBLAS GEMM alone and against a
# plain read of the same bytes.
#   scripts/experiments/probe-decode-small.sh [steps...]   (default: floor bench ncu)
#   floor: probes/read_floor.cu, the fastest one-kernel read of each shape's
#          weight bytes in graph replay (the floor under both kernels)
#   qfloor: the same for the quantized formats' bytes on the quantized
#          issue's shapes, against a 2 GiB read (h91: the roofline bar's ceiling)
#   stream: probes/decode_stream.cu, the decode kernel's sums fed by a
#          shared-memory ring that bulk copies fill (tensor-map boxes or
#          one-row copies) against the same sums on register loads
#   wgmma: probes/decode_wgmma.cu (h76-h78, h90), the weights as wgmma's A operand
#          from a TMA ring, N = 8 or 16 tokens, against cublasGemmEx and
#          the library's kernel in the same run (variants: its header)
#   quant: probes/quant_loop.cu (h80, h81), the int4 decode kernel's
#          loop with its bookkeeping taken out, X staged or prefetched,
#          and column groups per warp at M = 1 ... 64, against the
#          library's kernel (Y bit-identical first)
#   qtiled: probes/quant_tiled.cu (h95), the int4 tile on a tile-contiguous
#          copy of the words and scales (L1 wavefronts per k-block), M = 1,
#          8, 16, against the lean tile and the library's kernel
#   qwgmma: probes/quant_wgmma.cu (h82), int4 weights dequantized from a
#          TMA ring into wgmma's register A operand, X as its B operand
#          from the ring, M = 1 ... 64, against the library's kernel and
#          cuBLAS's bf16 GEMM
#   bench: `gatedmlp bench --model small` as shipped and under each of
#          SETTINGS (space-separated VAR=VALUE[,VAR=VALUE...], default
#          GATEDMLP_DECODE=0), interleaved, ROUNDS times (default 2), for
#          each of MODELS (default small; e.g. "small 8b 70b"), graph-timed. The
#          staged form h75 measured is docs/notes/data/h75-staged-form.patch
#          (git apply it on b2fe4f1; its knobs: GATEDMLP_DECODE_STAGED=0,
#          GATEDMLP_DECODE_STAGED_WARPS=w)
#   suites: the GPU test suites SUITES (default GpuDecode.*) as shipped and
#          under each of SETTINGS (h89) (needs $BUILD/tests/test_gpu: build it with
#          ARCHS=90a BUILD_TARGETS="gatedmlp_tool test_gpu" scripts/gpu-check.sh build
#          and BUILD=build-gpu)
#   ncu:   per-kernel duration, DRAM bytes and throughput, waves, of the
#          decode kernel and of torch.mm's cuBLAS kernel, at
#          M = 1 and 16, caches flushed between launches (cold weights)
# Needs a CUDA machine; builds build-small (90a, the tool only). Output to
# $OUT or ./profile-out.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
b=${BUILD:-build-small}
g="$b/tools/gatedmlp"
ms=${MS:-1,4,8,9,12,16}
build() {
  [ -x "$g" ] && return
  t0=$(date +%s)
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DGATEDMLP_BUILD_TESTS=OFF \
    >"$out/build.log" 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>"$out/build.log" 2>&1 ||
    { tail -20 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
}
rows() { grep -E "^(model|qwen-0.5b|1024x2816|llama-1b|llama-3b|8b|70b) " | cut -c1-110; }

for step in ${@:-floor bench ncu}; do
  case "$step" in
  floor)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/read_floor.cu -o "$out/read_floor" &&
      "$out/read_floor" | tee "$out/floor.txt" ;;
  qfloor)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/read_floor.cu -o "$out/read_floor" &&
      "$out/read_floor" quant | tee "$out/qfloor.txt"; rm -f "$out/read_floor" ;;
  stream)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/decode_stream.cu -o "$out/decode_stream" &&
      "$out/decode_stream" | tee "$out/stream.txt" ;;
  wgmma)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude scripts/experiments/probes/decode_wgmma.cu -lcublas -lcuda \
      -o "$out/decode_wgmma" && "$out/decode_wgmma" | tee "$out/wgmma.txt" ;;
  quant)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude scripts/experiments/probes/quant_loop.cu \
      -o "$out/quant_loop" && "$out/quant_loop" | tee "$out/quant-loop.txt" ;;
  qtiled)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude scripts/experiments/probes/quant_tiled.cu \
      -o "$out/quant_tiled" && timeout 300 "$out/quant_tiled" | tee "$out/quant-tiled.txt"; rm -f "$out/quant_tiled" ;;
  qwgmma)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude scripts/experiments/probes/quant_wgmma.cu \
      -lcublas -lcuda -o "$out/quant_wgmma" && timeout 300 "$out/quant_wgmma" | tee "$out/quant-wgmma.txt" ;;
  bench)
    build
    for r in $(seq "${ROUNDS:-2}"); do
      for model in ${MODELS:-small}; do
        echo "-- round $r: $model, as shipped"
        "$g" bench --model "$model" --m "$ms" --graph 2>>"$out/bench.err" | rows | tee -a "$out/bench-default.txt"
        for set in ${SETTINGS:-GATEDMLP_DECODE=0}; do
          echo "-- round $r: $model, $set"
          IFS=, read -ra kv <<<"$set"
          env "${kv[@]}" "$g" bench --model "$model" --m "$ms" --graph 2>>"$out/bench.err" | rows |
            tee -a "$out/bench-${set//[=,]/_}.txt"
        done
      done
    done
    echo "bench warnings (fused against unfused): $(grep -c WARNING "$out/bench.err")"; grep WARNING "$out/bench.err" | head -5 ;;
  suites)
    for set in "" ${SETTINGS:-}; do
      IFS=, read -ra kv <<<"$set"
      env "${kv[@]}" timeout 300 "$b/tests/test_gpu" --gtest_filter="${SUITES:-GpuDecode.*}" >"$out/suites.log" 2>&1
      echo "-- suites ${set:-as shipped}: rc=$?; $(grep -hoE '\[ cases \] [0-9]+' "$out/suites.log" | awk '{s+=$4} END {print s+0}') cases; $(grep -E 'PASSED|FAILED' "$out/suites.log" | tail -2 | tr '\n' ' ')"
      grep -E "^\[  FAILED|Failure" "$out/suites.log" | head -5 || true
    done ;;
  ncu)
    build
    metrics="gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__waves_per_multiprocessor,sm__warps_active.avg.pct_of_peak_sustained_active"
    ncu --csv --page raw --print-units base --kernel-name regex:decode_glu --launch-count 24 --metrics "$metrics" \
      "$g" bench --model small --m 1,16 --reps 3 --no-graph >"$out/ncu-decode.csv" 2>"$out/ncu-decode.err"
    cat >"$out/mm.py" <<'EOF'
import torch
for k, u in [(896, 4864), (1024, 2816), (2048, 8192), (3072, 8192)]:
    w = torch.randn(2 * u, k, device="cuda", dtype=torch.bfloat16)
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.mm(x, w.t())
torch.cuda.synchronize()
EOF
    ncu --csv --page raw --print-units base --metrics "$metrics" python3 "$out/mm.py" >"$out/ncu-mm.csv" 2>"$out/ncu-mm.err"
    rm -f "$out"/ncu-*.err
    python3 - "$out" <<'EOF'
import csv, sys, statistics, io
out = sys.argv[1]
def load(path):
    text = open(path).read()
    i = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[i:])))
    return [r for r in rows if r.get("Kernel Name") and r["Kernel Name"] != "Kernel Name" and r.get("ID", "").isdigit()]
def num(r, k):
    try: return float(r[k].replace(",", ""))
    except Exception: return float("nan")
for name in ("ncu-decode.csv", "ncu-mm.csv"):
    try: rows = load(f"{out}/{name}")
    except Exception as e: print(name, "unreadable:", e); continue
    print(f"# {name}")
    print(f"{'kernel':60s} {'grid':>6s} {'block':>5s} {'regs':>4s} {'waves':>6s} {'us':>8s} {'MB':>8s} {'TB/s':>6s} {'dram%':>6s} {'warps%':>6s}")
    groups = {}
    for r in rows:
        mb = round(num(r, "dram__bytes_read.sum") / 1e6)
        groups.setdefault((r["Kernel Name"][:60], r.get("launch__grid_size", ""), mb), []).append(r)
    for (kn, grid, _), rs in groups.items():
        med = lambda k: statistics.median(num(r, k) for r in rs)
        t, b = med("gpu__time_duration.sum"), med("dram__bytes_read.sum")  # ns, bytes
        print(f"{kn:60s} {grid:>6s} {rs[0].get('launch__block_size',''):>5s} {rs[0].get('launch__registers_per_thread',''):>4s} "
              f"{num(rs[0],'launch__waves_per_multiprocessor'):6.2f} {t/1e3:8.2f} {b/1e6:8.2f} {b/t/1e3:6.2f} "
              f"{med('dram__throughput.avg.pct_of_peak_sustained_elapsed'):6.1f} "
              f"{med('sm__warps_active.avg.pct_of_peak_sustained_active'):6.1f}  n={len(rs)}")
EOF
    ;;
  esac
done
