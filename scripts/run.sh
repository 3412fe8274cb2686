#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the kvmap demo on its embedded
# default data set under `mpirun -np ${KVMAP_NP:-2}`. Extra arguments go to the demo.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
kvmap_prepare default
np="${KVMAP_NP:-2}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec mpiexec -np "$np" --oversubscribe build/default/examples/kvmap-demo "$@"
