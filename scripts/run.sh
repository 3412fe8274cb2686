#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the perf harness on its embedded
# synthetic workload (--quick) under `mpirun -np ${KVMAP_NP:-2}`. Extra arguments go to
# kvmap-perf (e.g. --json results.json, --scenario overhead; pass --full for the full run).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
kvmap_prepare default
np="${KVMAP_NP:-2}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
args=(--quick)
if [ "${1:-}" = --full ]; then
  args=()
  shift
fi
exec mpiexec -np "$np" --oversubscribe build/default/perf/kvmap-perf "${args[@]}" "$@"
