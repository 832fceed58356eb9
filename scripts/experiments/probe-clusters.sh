#!/usr/bin/env bash
# Experiment h33 (docs/notes, what the library adds to the probe kernel): clusters of two against one-CTA launches, in the bench and in the probe harness.
# Clusters of two (the default for two or more row-blocks) against one-CTA
# launches (GATEDMLP_SM90_CLUSTER=1), per model and M, in the benchmark; then
# the probe harness with the library's calls (lib-*-c1: one CTA, no split).
#   scripts/experiments/probe-clusters.sh            (BUILD: build-ab, built if missing)
set -uo pipefail
cd "$(dirname "$0")/../.."
export BUILD="${BUILD:-build-ab}"
SETTINGS="- GATEDMLP_SM90_CLUSTER=1" MODEL=8b scripts/experiments/probe-waves.sh "${M8B:-1,64,128,256,384,512,768,1024,2048,4096,16384}" || exit 1
SETTINGS="- GATEDMLP_SM90_CLUSTER=1" MODEL=70b scripts/experiments/probe-waves.sh "${M70B:-256,512,1024,4096,16384}" || exit 1
SETTINGS="- GATEDMLP_SM90_CLUSTER=1" MODEL=405b scripts/experiments/probe-waves.sh "${M405B:-512,1024,4096,16384}" || exit 1
[ -n "${PROBE_M:-512 1024}" ] && LIB="$BUILD" OUT="${OUT:-/tmp}" scripts/experiments/probe-wide-tile.sh ${PROBE_M:-512 1024} |
  grep -E "^(==|cublas |n128s4-tma |n88s5-tma |n128-cl|n88-cl|lib-)" | grep -v PASS
