#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the perf harness on its embedded
# synthetic workload (--quick) on ${KVMAP_NP:-2} ranks, launched by build/default/kvmap-mpiexec
# (the MPI's launcher with that implementation's flags). Extra arguments go to
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
exec build/default/kvmap-mpiexec -n "$np" build/default/perf/kvmap-perf "${args[@]}" "$@"
