#pragma once
/// \file
/// kvmap: per-sample torch functions vectorized over Kokkos arrays sharded across MPI ranks.
#include "kvmap/agreement.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/config.hpp"
#include "kvmap/dist_view.hpp"
#include "kvmap/dtype.hpp"
#include "kvmap/error.hpp"
#include "kvmap/layout.hpp"
#include "kvmap/linalg.hpp"
#include "kvmap/overlap.hpp"
#include "kvmap/random.hpp"
#include "kvmap/runtime.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "kvmap/tolerance.hpp"
#include "kvmap/vmap.hpp"
