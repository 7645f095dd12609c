// Helpers shared by the ring and chain generators.
#pragma once

#include "core/planner.h"
#include "kernels/datatype.h"

namespace loom::core::ring {

inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline size_t elemSize(const OpDesc& op) { return kernels::dataTypeSize(op.type); }
// Per-rank parts are aligned to 64 bytes so kernels see aligned blocks.
inline size_t alignElems(const OpDesc& op) { return 64 / elemSize(op); }

inline Plan emptyPlan(const PlanParams& p, const char* algorithm) {
  Plan plan;
  plan.rank = p.rank;
  plan.nranks = p.nranks;
  plan.algorithm = algorithm;
  plan.streams.resize(1);
  return plan;
}

inline BufRef at(int buf, size_t elem, size_t esize) { return BufRef{buf, elem * esize}; }

}  // namespace loom::core::ring
