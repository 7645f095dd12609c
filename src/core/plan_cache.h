// Plans of a communicator's collectives, kept for reuse: a plan depends only
// on the operation's shape (collective, count, type, root) and the chosen
// algorithm, never on buffer addresses, so a training loop's repeated
// calls skip the planner. Bounded: when full it starts over.
// Used under the communicator's operation mutex.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "core/executor.h"
#include "core/plan.h"
#include "core/tuning.h"

namespace loom::core {

struct PlanKey {
  OpKind kind;
  size_t count;
  kernels::DataType type;
  int root;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = std::hash<size_t>()(k.count);
    h = h * 31 + size_t(k.kind);
    h = h * 31 + size_t(k.type);
    return h * 31 + size_t(k.root);
  }
};

struct CachedPlan {
  Plan plan;
  std::vector<int> links;  // the connections it uses (linkIndex), sorted
  Choice choice;           // the algorithm and its estimate
  // A finished host runner of this plan, kept for the next call (taken
  // while one runs, so two calls in one group each get their own).
  mutable std::unique_ptr<PlanRunner> spare;
};

class PlanCache {
 public:
  static constexpr size_t kMaxEntries = 1024;
  std::shared_ptr<const CachedPlan> find(const PlanKey& key) const {
    auto it = plans_.find(key);
    return it == plans_.end() ? nullptr : it->second;
  }
  void insert(const PlanKey& key, std::shared_ptr<const CachedPlan> plan) {
    if (plans_.size() >= kMaxEntries) plans_.clear();
    plans_[key] = std::move(plan);
  }

 private:
  std::unordered_map<PlanKey, std::shared_ptr<const CachedPlan>, PlanKeyHash> plans_;
};

}  // namespace loom::core
