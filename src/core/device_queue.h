// Cuda mode: a communicator's operations on device buffers, ordered on the
// callers' CUDA streams, run by a progress thread of its own.
//
// Submitting (the caller's thread, at the call or at ncclGroupEnd) queues on
// each stream the job's operations touch: a host function that marks the
// job ready once the work queued before it on that stream has finished
// (queueHostFunctions), then a gate that holds back the stream's later work
// until the job is released (queueGates). It returns at once and never
// waits for a peer.
//
// The progress thread runs ready jobs in submission order (the order every
// rank called them in) through the engine, with a DeviceContext: each step's
// arithmetic is a kernel on the queue's own stream, launched by the thread
// once the step's input has arrived (core/executor.h). Each job ends by publishing its sequence number to a word in pinned host
// memory that the gates read; failures are recorded as the communicator's
// sticky error (ncclCommGetAsyncError) and release the streams too, as
// abort() does for every queued job at once: no user stream is ever left
// waiting on loom.
//
// CUDA graphs: an operation called while its stream is being captured is
// not queued; the capture gets a host function that queues it at each
// replay and a gate on words of its own (DeviceQueue::Replay), kept alive
// by the graph. A replay after the communicator is gone opens its gate at
// once and runs nothing.
//
// Lifetime: a queued job pins its communicator (CommRef), so destroying it
// waits for queued work; the communicator destroys its queue only when no
// job is left, joining the thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "core/executor.h"
#include "core/op.h"
#include "core/plan_cache.h"
#include "device/device.h"

namespace loom::core {

class Communicator;
class CommRef;

class DeviceQueue {
  struct Job;
  struct Replay;

 public:
  // `comm` owns the queue and outlives it.
  static Result<std::unique_ptr<DeviceQueue>> create(Communicator* comm, device::Api* api);
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  // Queues one communicator's operations of a group (their OpDesc::stream
  // say where each belongs). `pin` pins the owning communicator. In two
  // halves: the host functions, then the gates. A group whose communicators
  // share a stream (ranks of one process) queues every host function before
  // any gate, since a gate holds back everything behind it on its stream,
  // the other communicators' host functions included.
  struct Submission {
    std::shared_ptr<Job> job;
    std::vector<bool> hostFunctionQueued;  // per stream of the job
    std::shared_ptr<Replay> replay;        // captured instead
    Status queued;                         // the first launch that failed
  };
  Result<std::unique_ptr<Submission>> queueHostFunctions(CommRef pin, std::vector<OpDesc> ops);
  // The caller's thread, before any gate of the group is queued: makes the
  // staging memory `ops` will bind exist now (Scratch::reserve), pinned and
  // on the device (which one a job binds depends on its connections). A
  // collective's figure is kept per shape, so a repeated call plans nothing.
  Status reserveStaging(std::span<const OpDesc> ops);
  // At init, once the schedule is known (the caller's thread): reserves what
  // each collective, and sends and receives, need at any size, so that a
  // first call neither allocates nor waits for the stream's earlier work.
  // Their staging stops growing once every slot holds a whole slice.
  Status reserveForEverySize();
  Status queueGates(Submission& submission);
  // The communicator's device: current on the thread that queues.
  int device() const;
  // Waits until every job submitted so far has been released, at most
  // `seconds` (<= 0: no limit); an error when the time ran out.
  Status drain(double seconds);
  // Any thread: releases every queued job and its streams now (the
  // communicator is aborted; a running job stops through the abort flag).
  void abort();

 private:
  struct Signal;
  DeviceQueue(Communicator* comm, device::Api* api);
  Result<std::unique_ptr<Submission>> capture(std::vector<OpDesc> ops, device::Stream stream);
  // The staging memory `ops` bind at most (see reserveStaging), and reserving it.
  size_t stagingNeed(std::span<const OpDesc> ops);
  Status reserve(size_t bytes);
  std::deque<std::shared_ptr<Job>>::iterator nextJob();
  bool replayHeldBack() const;
  void loop();
  Status run(Job& job);
  void flushConnections();
  void releaseAll();

  Communicator* const comm_;
  device::Api* const api_;
  std::shared_ptr<Signal> signal_;  // shared with host functions that may outlive the queue
  uint64_t* word_ = nullptr;        // the gates' word (device::gateWord)
  uint64_t base_ = 0;               // its value when this queue took it
  device::Stream stream_ = nullptr;  // the engine's kernels and copies
  Scratch pinned_;                   // staging slots for host transports
  Scratch onDevice_;                 // staging slots when only device-moving ones take part
  std::mutex stagingMutex_;          // callers' threads: the figures below
  std::unordered_map<PlanKey, size_t, PlanKeyHash> stagingOf_;
  std::vector<device::Event> events_;
  DeviceContext context_;
  std::thread thread_;
};

}  // namespace loom::core
