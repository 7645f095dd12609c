// What init costs the network, per rank, as the communicator grows: 16, 32
// and 64 ranks as threads of this process each init one communicator; every
// rank's bootstrap counts the messages and bytes it sent and received, and
// the rendezvous root counts its own. Per rank (and for the root) the counts
// may grow at most linearly with nranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "core/communicator.h"
#include "core/traffic.h"

namespace loom::core {
namespace {

struct Cost {
  int nranks = 0;
  uint64_t rankMessages = 0, rankBytes = 0;  // the busiest rank's, sent + received
  uint64_t rootMessages = 0, rootBytes = 0;
};

Cost initCost(int n) {
  Cost cost;
  cost.nranks = n;
  uint8_t id[kUniqueIdBytes];
  EXPECT_TRUE(getUniqueId(id).isOk());
  const TrafficCounts rootBefore = rootTraffic().counts();
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(n));
  std::vector<Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    comms[size_t(r)] = std::make_unique<Communicator>(CommOptions::fromSettings());
    threads.emplace_back([&, r] { results[size_t(r)] = comms[size_t(r)]->initFromId(id, n, r); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(results[size_t(r)].isOk()) << "rank " << r << ": " << results[size_t(r)].message();
    const TrafficCounts t = comms[size_t(r)]->bootstrap().traffic();
    cost.rankMessages = std::max(cost.rankMessages, t.sentMessages + t.receivedMessages);
    cost.rankBytes = std::max(cost.rankBytes, t.sentBytes + t.receivedBytes);
  }
  const TrafficCounts rootAfter = rootTraffic().counts();
  cost.rootMessages = (rootAfter.sentMessages - rootBefore.sentMessages) +
                      (rootAfter.receivedMessages - rootBefore.receivedMessages);
  cost.rootBytes = (rootAfter.sentBytes - rootBefore.sentBytes) + (rootAfter.receivedBytes - rootBefore.receivedBytes);
  for (auto& c : comms) EXPECT_TRUE(c->closeAndWait(30));
  return cost;
}

TEST(BootstrapScale, InitTrafficGrowsLinearly) {
  std::vector<Cost> costs;
  for (int n : {16, 32, 64}) {
    costs.push_back(initCost(n));
    const Cost& c = costs.back();
    std::printf("%3d ranks: busiest rank %5llu messages %8llu bytes; root %4llu messages %7llu bytes\n", n,
                (unsigned long long)c.rankMessages, (unsigned long long)c.rankBytes,
                (unsigned long long)c.rootMessages, (unsigned long long)c.rootBytes);
  }
  // Doubling the ranks at most doubles each count (plus a little for what
  // every rank sends whatever the size: the join, hellos, the ring's setup).
  for (size_t i = 1; i < costs.size(); ++i) {
    const Cost &a = costs[i - 1], &b = costs[i];
    SCOPED_TRACE(std::to_string(a.nranks) + " -> " + std::to_string(b.nranks) + " ranks");
    EXPECT_LE(b.rankMessages, 2 * a.rankMessages + 16);
    EXPECT_LE(b.rankBytes, 2 * a.rankBytes + 4096);
    EXPECT_EQ(b.rootMessages, 2 * a.rootMessages);  // a join and an answer per rank
    EXPECT_LE(b.rootBytes, 2 * a.rootBytes + 4096);
    EXPECT_GT(b.rankMessages, a.rankMessages);  // the counts are real: they grow
  }
}

}  // namespace
}  // namespace loom::core
