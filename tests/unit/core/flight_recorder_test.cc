#include "core/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#if defined(__SANITIZE_THREAD__)
#define LOOM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOOM_TEST_TSAN 1
#endif
#endif
#ifndef LOOM_TEST_TSAN
#define LOOM_TEST_TSAN 0
#endif

namespace loom::core {
namespace {

FlightRecorder::Entry op(uint64_t seq) {
  FlightRecorder::Entry e;
  e.seq = seq;
  e.kind = "AllReduce";
  e.count = 8 * seq;
  e.type = "float";
  e.op = "sum";
  return e;
}

TEST(FlightRecorder, KeepsTheNewestEntriesWithTheirStates) {
  FlightRecorder r(3);
  std::vector<uint64_t> ids;
  for (uint64_t s = 1; s <= 5; ++s) ids.push_back(r.record(op(s)));
  r.started(ids[0]);  // overwritten: ignored
  r.started(ids[3]);
  r.finished(ids[3], true);
  r.started(ids[4]);
  r.finished(ids[4], false);
  auto entries = r.snapshot();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].seq, 3u);
  EXPECT_EQ(entries[0].state, FlightRecorder::State::kQueued);
  EXPECT_EQ(entries[1].state, FlightRecorder::State::kDone);
  EXPECT_EQ(entries[2].state, FlightRecorder::State::kFailed);
  EXPECT_GT(entries[1].enqueueUs, 0);
  EXPECT_GE(entries[1].startUs, entries[1].enqueueUs);
  EXPECT_GE(entries[1].endUs, entries[1].startUs);
  EXPECT_EQ(entries[0].startUs, 0);
}

// The writer takes no lock: a reader that copies entries while they are
// rewritten must still get each one whole (its fields from one write),
// the newest ones, in order.
TEST(FlightRecorder, ReadersSeeWholeEntriesWhileTheWriterRuns) {
  FlightRecorder r(64);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t s = 1; !stop.load(std::memory_order_relaxed); ++s) {
      FlightRecorder::Entry e = op(s);
      e.collSeq = s + 1;
      e.root = int(s % 7);
      e.kind = s % 2 ? "AllReduce" : "Broadcast";
      const uint64_t id = r.record(e);
      r.started(id);
      r.finished(id, s % 3 != 0);
    }
  });
  // Entries whose fields disagree (or come out of order); the writer is
  // joined before the test reports.
  size_t seen = 0, torn = 0;
  for (int round = 0; round < 5000 && torn == 0; round += seen > 0) {  // 5000 rounds once the writer has started
    uint64_t last = 0;
    for (const FlightRecorder::Entry& e : r.snapshot()) {
      const bool whole = e.count == 8 * e.seq && e.collSeq == e.seq + 1 && e.root == int(e.seq % 7) &&
                         std::string(e.kind) == (e.seq % 2 ? "AllReduce" : "Broadcast") &&
                         (e.state == FlightRecorder::State::kQueued || e.startUs >= e.enqueueUs) &&
                         (e.endUs == 0 || e.endUs >= e.startUs);
      torn += !whole || e.seq <= last;  // oldest first, no entry twice
      last = e.seq;
      ++seen;
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(torn, 0u) << "of " << seen << " entries read";
}

// An operation recorded as it starts (running) or once it finished (done,
// as the latency path records the ones that complete at once).
TEST(FlightRecorder, RecordsRunningAndFinishedOperationsInOneCall) {
  FlightRecorder r(4);
  r.record(op(1), FlightRecorder::State::kRunning);
  r.record(op(2), FlightRecorder::State::kDone);
  auto entries = r.snapshot();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].state, FlightRecorder::State::kRunning);
  EXPECT_EQ(entries[0].startUs, entries[0].enqueueUs);
  EXPECT_EQ(entries[0].endUs, 0);
  EXPECT_EQ(entries[1].state, FlightRecorder::State::kDone);
  EXPECT_GT(entries[1].enqueueUs, 0);
  EXPECT_EQ(entries[1].startUs, entries[1].enqueueUs);
  EXPECT_EQ(entries[1].endUs, entries[1].enqueueUs);
}

// Threads of this process named `name`.
int threadsNamed(const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    n += std::getline(comm, line) && line == name;
  }
  return n;
}

// threadsNamed(name) once it is `want`, or after 2 s: a joined thread
// stays in /proc/self/task a moment after pthread_join returns.
int threadsNamedSoon(const std::string& name, int want) {
  int n = threadsNamed(name);
  for (int i = 0; i < 2000 && n != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = threadsNamed(name);
  }
  return n;
}

// The entries' times come from the clock thread's copy of the wall clock:
// it runs while a recorder that recorded lives, keeps up with the clock,
// and is joined when the last such recorder goes.
TEST(FlightRecorder, TheClockThreadRunsWhileRecordersUseItAndKeepsTime) {
  ASSERT_EQ(threadsNamedSoon("loom-clock", 0), 0) << "a recorder of an earlier test is still alive";
  {
    auto a = std::make_unique<FlightRecorder>(4);
    FlightRecorder unused(4);  // never records: starts nothing
    EXPECT_EQ(threadsNamed("loom-clock"), 0);
    const int64_t before = wallMicros();
    a->record(op(1), FlightRecorder::State::kDone);
    const int64_t after = wallMicros();
    EXPECT_EQ(threadsNamed("loom-clock"), 1);
    FlightRecorder b(4);
    b.record(op(1));
    EXPECT_EQ(threadsNamed("loom-clock"), 1) << "one thread per process, not per recorder";
    // Read again every 4 ms: after a sleep of 60 ms the entries' times
    // move by about as much (less the steps at either end). A thread that
    // has not run meanwhile (a loaded machine) catches up within 2 s.
    const int64_t first = a->snapshot().front().enqueueUs;
    EXPECT_GE(first, before - 10000);
    EXPECT_LE(first, after + 10000);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    const auto start = std::chrono::steady_clock::now();
    int64_t last = 0;
    for (;;) {
      a->record(op(2), FlightRecorder::State::kDone);
      last = a->snapshot().back().enqueueUs;
      if (last - first >= 40000 || std::chrono::steady_clock::now() - start > std::chrono::seconds(2)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE(last - first, 40000) << "the clock thread did not keep time";
    EXPECT_LE(last - first, 10000000);
    a.reset();
    EXPECT_EQ(threadsNamed("loom-clock"), 1) << "b still uses it";
  }
  EXPECT_EQ(threadsNamedSoon("loom-clock", 0), 0) << "joined with the last recorder";
}

// A forked child has no clock thread: its recorders read the clock, or
// start a thread of their own; a recorder from before the fork, destroyed
// in the child, releases nothing there.
TEST(FlightRecorder, AForkedChildKeepsTime) {
#if LOOM_TEST_TSAN
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  auto before = std::make_unique<FlightRecorder>(4);
  before->record(op(1));
  ASSERT_EQ(threadsNamedSoon("loom-clock", 1), 1);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    bad |= threadsNamed("loom-clock") != 0;
    const int64_t t0 = wallMicros();
    before->record(op(2), FlightRecorder::State::kDone);  // no thread: the clock itself
    auto entries = before->snapshot();
    bad |= (entries.size() != 2 || entries[1].enqueueUs < t0 - 10000 || entries[1].enqueueUs > wallMicros() + 10000) << 1;
    {
      FlightRecorder mine(4);
      mine.record(op(1));
      bad |= (threadsNamed("loom-clock") != 1) << 2;
      before.reset();  // the parent's: must leave the child's thread running
      bad |= (threadsNamed("loom-clock") != 1) << 3;
    }
    bad |= (threadsNamedSoon("loom-clock", 0) != 0) << 4;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 a thread in the child, 2 a wrong time, 4 no thread for a new "
                                       "recorder, 8 stopped by the parent's recorder, 16 not joined";
  EXPECT_EQ(threadsNamed("loom-clock"), 1) << "the parent's thread is unaffected";
  before.reset();
  EXPECT_EQ(threadsNamedSoon("loom-clock", 0), 0);
}

TEST(FlightRecorder, NoCapacityRecordsNothing) {
  FlightRecorder r(0);
  EXPECT_EQ(r.record(op(1)), 0u);
  r.started(0);
  EXPECT_TRUE(r.snapshot().empty());
}

TEST(FlightRecorder, WritesOneLinePerOperationUnderAHeader) {
  FlightRecorder r(4);
  r.setIdentity({0xabcdef, 2, 5, "node\"7"});
  r.finished(r.record(op(1)), true);
  r.record(op(2));
  char dir[] = "/tmp/loom-flight-unit-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto path = r.dump(dir, "a \"reason\"\nwith a newline");
  ASSERT_TRUE(path.isOk()) << path.status().message();
  EXPECT_EQ(path.value(), std::string(dir) + "/loom-flight-0000000000abcdef-rank2.json");
  std::ifstream in(path.value());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("{\"loom_flight_recorder\":1,\"comm\":\"0000000000abcdef\",\"rank\":2,\"nranks\":5,"
                           "\"host\":\"node\\\"7\",\"pid\":",
                           0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find("\"reason\":\"a \\\"reason\\\"\\u000awith a newline\"}"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].rfind("{\"seq\":1,\"coll\":0,\"kind\":\"AllReduce\",\"count\":8,\"type\":\"float\",\"op\":\"sum\",\"root\":-1,"
                           "\"state\":\"done\",",
                           0),
            0u)
      << lines[1];
  EXPECT_NE(lines[2].find("\"state\":\"queued\""), std::string::npos) << lines[2];
  std::remove(path.value().c_str());
  EXPECT_FALSE(r.dump("/nonexistent-dir", "x").isOk());
  rmdir(dir);
}

}  // namespace
}  // namespace loom::core
