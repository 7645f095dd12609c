// loom-info --plan and --algos: the planner's plans and the cost model's
// choices, printed without a communicator (the only tool that reads
// src/core, by the algorithms issue's leave).
#pragma once

namespace loom::info {

// --plan COLLECTIVE NRANKS COUNT [--rank R] [--algo NAME] [--root R] [--type T]
int printPlan(int argc, char** argv);
// --algos [NRANKS] [--net]: per collective and size, the estimates and the
// choice (NCCL_ALGO applies), and the sizes where the choice changes.
int printAlgos(int argc, char** argv);

}  // namespace loom::info
