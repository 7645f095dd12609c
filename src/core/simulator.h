// The simulator: runs the plans of all ranks of one operation in one thread,
// over in-memory connections, with no network. Tests use it to check every
// algorithm for many rank counts quickly; a plan that would deadlock is
// reported with the plans of the stuck ranks. A send completes only once its
// receive is posted (as a single-copy send does), so a plan that runs only
// because a transport buffers its sends deadlocks here too.
#pragma once

#include <vector>

#include "common/status.h"
#include "core/plan.h"
#include "kernels/reduce.h"

namespace loom::core {

// plans[r] and buffers[r] belong to rank r.
Status simulate(const std::vector<Plan>& plans, const std::vector<std::vector<std::byte*>>& buffers,
                const kernels::Reduction& reduction, bool reducing);

}  // namespace loom::core
