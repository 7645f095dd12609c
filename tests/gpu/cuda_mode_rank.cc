// One rank of a cuda-mode job as a process, on the emulated device (each
// process has its own). Started by cuda_mode_process_test.cc with
// NCCL_COMM_ID and LOOM_COMM_SECRET set.
//
//   loom_cuda_mode_rank <rank> <nranks> collectives   AllReduce, AllGather and
//                                                      Send/Recv rings (one from a
//                                                      registered buffer) on
//                                                      device buffers, checked
//   loom_cuda_mode_rank <rank> <nranks> peer-dies     rank 1 exits right after
//                                                      init; the others' queued
//                                                      AllReduce must fail, with
//                                                      their streams released
// Prints "rank R: ok" (and exits 0) when everything checked out. With
// LOOM_TEST_EMULATED_IPC=off in the environment the emulated device refuses
// to open IPC handles.
#include <loom/loom.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "device/device.h"
#include "emulated_device.h"

namespace {

using loom::test::EmulatedDevice;

int fail(int rank, const std::string& what) {
  std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <rank> <nranks> collectives|peer-dies\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), n = std::atoi(argv[2]);
  const std::string what = argv[3];
  const char* ipc = std::getenv("LOOM_TEST_EMULATED_IPC");
  static EmulatedDevice* emu =
      new EmulatedDevice(EmulatedDevice::Options::with(1, 500, !(ipc && std::strcmp(ipc, "off") == 0)));
  loom::device::setApiForTesting(emu);

  loomSetBufferMode(loomBufferModeCuda);  // whatever LOOM_DEVICE says
  ncclUniqueId id{};
  if (ncclGetUniqueId(&id) != ncclSuccess) return fail(rank, std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr));
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
    return fail(rank, std::string("init: ") + ncclGetLastError(nullptr));
  }
  void* stream = emu->createStream().value();
  auto* s = static_cast<cudaStream_t>(stream);
  constexpr size_t kCount = 50000;
  void* a = emu->allocDevice(kCount * size_t(n) * sizeof(float)).value();
  void* b = emu->allocDevice(kCount * size_t(n) * sizeof(float)).value();
  auto* ha = static_cast<float*>(EmulatedDevice::hostView(a));
  auto* hb = static_cast<float*>(EmulatedDevice::hostView(b));
  auto drained = [&](int seconds) {
    auto f = std::async(std::launch::async, [&] { return emu->synchronize(stream).isOk(); });
    return f.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready && f.get();
  };

  if (what == "peer-dies") {
    if (rank == 1) _exit(3);  // no goodbye: its peers see the connection die
    std::fill_n(ha, kCount, 1.0f);
    if (ncclAllReduce(a, a, kCount, ncclFloat, ncclSum, comm, s) != ncclSuccess) {
      return fail(rank, std::string("AllReduce was refused at the call: ") + ncclGetLastError(comm));
    }
    if (!drained(60)) return fail(rank, "the stream is still gated 60 s after the peer died");
    ncclResult_t async = ncclSuccess;
    for (int i = 0; i < 100 && async == ncclSuccess; ++i) {
      ncclCommGetAsyncError(comm, &async);
      if (async == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (async == ncclSuccess) return fail(rank, "no asynchronous error after the peer died");
    ncclCommAbort(comm);
  } else {
    // AllReduce of (rank + 1) * i.
    for (size_t i = 0; i < kCount; ++i) ha[i] = float((rank + 1) * int(i % 101));
    if (ncclAllReduce(a, b, kCount, ncclFloat, ncclSum, comm, s) != ncclSuccess) return fail(rank, "AllReduce");
    if (!drained(60)) return fail(rank, "AllReduce: stream still gated");
    const float total = float(n * (n + 1) / 2);
    for (size_t i = 0; i < kCount; ++i)
      if (hb[i] != total * float(int(i % 101))) return fail(rank, "AllReduce element " + std::to_string(i));
    // AllGather of rank-tagged blocks.
    for (size_t i = 0; i < kCount; ++i) ha[i] = float(rank * 100000 + int(i % 1009));
    if (ncclAllGather(a, b, kCount, ncclFloat, comm, s) != ncclSuccess) return fail(rank, "AllGather");
    if (!drained(60)) return fail(rank, "AllGather: stream still gated");
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < kCount; ++i)
        if (hb[size_t(p) * kCount + i] != float(p * 100000 + int(i % 1009))) {
          return fail(rank, "AllGather block " + std::to_string(p) + " element " + std::to_string(i));
        }
    // Send/Recv ring.
    ncclGroupStart();
    ncclSend(a, kCount, ncclFloat, (rank + 1) % n, comm, s);
    ncclRecv(b, kCount, ncclFloat, (rank + n - 1) % n, comm, s);
    if (ncclGroupEnd() != ncclSuccess) return fail(rank, "Send/Recv");
    if (!drained(60)) return fail(rank, "Send/Recv: stream still gated");
    const int from = (rank + n - 1) % n;
    for (size_t i = 0; i < kCount; ++i)
      if (hb[i] != float(from * 100000 + int(i % 1009))) return fail(rank, "Recv element " + std::to_string(i));
    // Send/Recv ring from a registered buffer larger than an inbox slot:
    // the receivers map it at their next call (the first round goes
    // through the inboxes), the second round copies straight out of it.
    constexpr size_t kBig = (size_t(1) << 20) / sizeof(float);
    void* reg = emu->allocDevice(kBig * sizeof(float)).value();
    void* got = emu->allocDevice(kBig * sizeof(float)).value();
    auto* hr = static_cast<float*>(EmulatedDevice::hostView(reg));
    auto* hg = static_cast<float*>(EmulatedDevice::hostView(got));
    void* handle = nullptr;
    if (ncclCommRegister(comm, reg, kBig * sizeof(float), &handle) != ncclSuccess) return fail(rank, "register");
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < kBig; ++i) hr[i] = float(rank * 1000 + round * 100 + int(i % 89));
      std::fill_n(hg, kBig, -1.0f);
      ncclGroupStart();
      ncclSend(reg, kBig, ncclFloat, (rank + 1) % n, comm, s);
      ncclRecv(got, kBig, ncclFloat, (rank + n - 1) % n, comm, s);
      if (ncclGroupEnd() != ncclSuccess) return fail(rank, "registered Send/Recv");
      if (!drained(60)) return fail(rank, "registered Send/Recv: stream still gated");
      for (size_t i = 0; i < kBig; ++i)
        if (hg[i] != float(from * 1000 + round * 100 + int(i % 89))) {
          return fail(rank, "registered round " + std::to_string(round) + " element " + std::to_string(i));
        }
    }
    if (ncclCommDeregister(comm, handle) != ncclSuccess) return fail(rank, "deregister");
    emu->freeDevice(reg);
    emu->freeDevice(got);
    if (ncclCommFinalize(comm) != ncclSuccess) return fail(rank, "finalize");
    if (ncclCommDestroy(comm) != ncclSuccess) return fail(rank, "destroy");
  }
  emu->freeDevice(a);
  emu->freeDevice(b);
  emu->destroyStream(stream);
  std::printf("rank %d: ok\n", rank);
  std::fflush(stdout);
  return 0;
}
