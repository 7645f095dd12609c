// Device checks of loom's cuda mode that need a real GPU, for
// tools/gpu_check.sh. Each mode prints what it measured and ends with
// "<mode>: ok" (exit 0) or "<mode>: FAILED: <why>" (exit 1).
//
//   gpu_stream_check latency  a call queued behind a 200 ms kernel returns
//                             in < 1 ms and is correct after synchronising;
//                             the median cost of enqueuing (2 ranks)
//   gpu_stream_check graph    AllReduce captured into a CUDA graph (global
//                             capture mode, as PyTorch's), replayed 10
//                             times with new inputs
//   gpu_stream_check abort    ncclCommAbort of the peer, and of the rank
//                             itself, release the rank's stream with an error
//   gpu_stream_check kill     a peer process killed with SIGKILL releases
//                             the rank's stream with an error
//   gpu_stream_check bench    the reduce kernel (float, bfloat16; sum of 2
//                             sources, 256 MiB) against a 256 MiB
//                             device-to-device copy, and 2-rank AllReduce
//                             busbw at 256 MiB, with the targets
// Ranks share device 0 (as threads of this process, or a forked child).
// Exit status: 0 ok, 1 failed (a wrong result, a hang, an error), 3 correct
// but a timing target missed ("<mode>: MISS: <why>").
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string gMode;

[[noreturn]] void fail(const std::string& why) {
  std::printf("%s: FAILED: %s\n", gMode.c_str(), why.c_str());
  std::fflush(stdout);
  std::exit(1);
}

// A timing target missed: the results were right.
[[noreturn]] void miss(const std::string& why) {
  std::printf("%s: MISS: %s\n", gMode.c_str(), why.c_str());
  std::fflush(stdout);
  std::exit(3);
}

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}

void nccl(ncclResult_t r, const char* what, ncclComm_t c = nullptr) {
  if (r != ncclSuccess) fail(std::string(what) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(c) + ")");
}

// A pinned word a gate kernel waits on: holds a stream until open().
struct Hold {
  Hold() { cuda(cudaHostAlloc(reinterpret_cast<void**>(&word), sizeof *word, cudaHostAllocMapped), "cudaHostAlloc"); *word = 0; }
  ~Hold() { cudaFreeHost(word); }
  void on(cudaStream_t s) {
    if (!loom::kernels::cuda::gate(word, 1, s).isOk()) fail("gate kernel launch");
  }
  void open() { __atomic_store_n(word, uint64_t(1), __ATOMIC_RELEASE); }
  uint64_t* word = nullptr;
};

// Waits for `s` at most `seconds`: false when it is still busy.
bool drains(cudaStream_t s, double seconds) {
  auto t = Clock::now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) fail(std::string("cudaStreamQuery: ") + cudaGetErrorString(e));
    if (secondsSince(t) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct Ranks {
  explicit Ranks(int n) : comms(size_t(n)), streams(size_t(n)) {
    std::vector<int> devs(size_t(n), 0);
    nccl(ncclCommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll");
    for (auto& s : streams) cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Ranks() {
    for (auto s : streams) cudaStreamDestroy(s);
    for (auto c : comms)
      if (c) ncclCommDestroy(c);
  }
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
};

float* deviceFloats(size_t n, float value) {
  float* p = nullptr;
  cuda(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)), "cudaMalloc");
  std::vector<float> h(n, value);
  cuda(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

void expectAll(const float* dev, size_t n, float want, const char* what) {
  std::vector<float> h(n);
  cuda(cudaMemcpy(h.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (size_t i = 0; i < n; ++i)
    if (h[i] != want) fail(std::string(what) + ": element " + std::to_string(i) + " is " + std::to_string(h[i]) +
                           ", expected " + std::to_string(want));
}

void allReduceBoth(Ranks& r, float* const* in, float* const* out, size_t n) {
  nccl(ncclGroupStart(), "ncclGroupStart");
  for (size_t i = 0; i < r.comms.size(); ++i)
    nccl(ncclAllReduce(in[i], out[i], n, ncclFloat, ncclSum, r.comms[i], r.streams[i]), "ncclAllReduce", r.comms[i]);
  nccl(ncclGroupEnd(), "ncclGroupEnd");
}

int latency() {
  Ranks r(2);
  constexpr size_t kCount = 1 << 20;
  float* in[2] = {deviceFloats(kCount, 1), deviceFloats(kCount, 2)};
  float* out[2] = {deviceFloats(kCount, 0), deviceFloats(kCount, 0)};
  Hold hold;
  for (auto s : r.streams) hold.on(s);
  const auto held = Clock::now();
  allReduceBoth(r, in, out, kCount);
  const double returned = secondsSince(held);
  std::printf("latency: the group of 2 AllReduce calls behind a 200 ms kernel returned after %.3f ms\n",
              returned * 1e3);
  std::this_thread::sleep_for(std::chrono::milliseconds(200) - (Clock::now() - held));
  hold.open();
  for (auto s : r.streams)
    if (!drains(s, 60)) fail("the streams did not drain within 60 s");
  for (float* o : out) expectAll(o, kCount, 3.0f, "AllReduce behind the gate");
  // Returning after the kernel is a synchronous call: wrong. Between 1 ms
  // and that, a slow enqueue: a missed target.
  if (returned >= 0.15) fail("the call returned after " + std::to_string(returned * 1e3) + " ms: it waited for the stream");
  std::string missed;
  if (returned >= 1e-3) missed = "the call took " + std::to_string(returned * 1e3) + " ms to return (target < 1 ms)";

  // Enqueue cost: a group of one AllReduce per rank, 4 KiB each.
  std::vector<double> perCall;
  for (int i = 0; i < 300; ++i) {
    auto t = Clock::now();
    allReduceBoth(r, in, out, 1024);
    perCall.push_back(secondsSince(t) / 2);
    if (i % 50 == 49)
      for (auto s : r.streams) cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  for (auto s : r.streams) cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  std::nth_element(perCall.begin(), perCall.begin() + perCall.size() / 2, perCall.end());
  const double median = perCall[perCall.size() / 2];
  std::printf("latency: enqueue cost per call, median of 300 groups: %.2f us (target < 20 us)\n", median * 1e6);
  for (int i = 0; i < 2; ++i) {
    cudaFree(in[i]);
    cudaFree(out[i]);
  }
  if (median >= 20e-6) missed += (missed.empty() ? "" : "; ") + ("enqueue cost " + std::to_string(median * 1e6) + " us (target < 20 us)");
  if (!missed.empty()) miss(missed);
  std::printf("latency: ok\n");
  return 0;
}

int graph() {
  Ranks r(2);
  constexpr size_t kCount = 1 << 18;
  constexpr int kReplays = 10;
  float* in[2] = {deviceFloats(kCount, 0), deviceFloats(kCount, 0)};
  float* out[2] = {deviceFloats(kCount, -1), deviceFloats(kCount, -1)};
  cudaGraph_t graphs[2];
  for (auto s : r.streams) cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  allReduceBoth(r, in, out, kCount);
  for (int i = 0; i < 2; ++i) cuda(cudaStreamEndCapture(r.streams[size_t(i)], &graphs[i]), "cudaStreamEndCapture");
  cudaGraphExec_t execs[2];
  for (int i = 0; i < 2; ++i) cuda(cudaGraphInstantiate(&execs[i], graphs[i], 0), "cudaGraphInstantiate");
  expectAll(out[0], 16, -1.0f, "capture must not run the collective");
  // Inputs and results live in pinned memory: a copy to or from pageable
  // memory waits for the stream on the calling thread, and rank 0's replay
  // cannot finish before rank 1's is launched.
  float* inputs = nullptr;
  float* results = nullptr;
  const size_t total = size_t(2 * kReplays) * kCount;
  cuda(cudaMallocHost(reinterpret_cast<void**>(&inputs), total * sizeof(float)), "cudaMallocHost");
  cuda(cudaMallocHost(reinterpret_cast<void**>(&results), total * sizeof(float)), "cudaMallocHost");
  for (int k = 0; k < kReplays; ++k)
    for (int i = 0; i < 2; ++i) {
      float* src = inputs + size_t(2 * k + i) * kCount;
      std::fill(src, src + kCount, float((i + 1) * (k + 1)));
      cuda(cudaMemcpyAsync(in[i], src, kCount * sizeof(float), cudaMemcpyHostToDevice, r.streams[size_t(i)]),
           "cudaMemcpyAsync");
      cuda(cudaGraphLaunch(execs[i], r.streams[size_t(i)]), "cudaGraphLaunch");
      cuda(cudaMemcpyAsync(results + size_t(2 * k + i) * kCount, out[i], kCount * sizeof(float),
                           cudaMemcpyDeviceToHost, r.streams[size_t(i)]),
           "cudaMemcpyAsync");
    }
  for (auto s : r.streams)
    if (!drains(s, 60)) fail("the replays did not finish within 60 s");
  for (int k = 0; k < kReplays; ++k)
    for (int i = 0; i < 2; ++i)
      for (size_t e = 0; e < kCount; ++e)
        if (results[size_t(2 * k + i) * kCount + e] != float(3 * (k + 1)))
          fail("replay " + std::to_string(k + 1) + " rank " + std::to_string(i) + " element " + std::to_string(e));
  cudaFreeHost(inputs);
  cudaFreeHost(results);
  for (int i = 0; i < 2; ++i) {
    cudaGraphExecDestroy(execs[i]);
    cudaGraphDestroy(graphs[i]);
    cudaFree(in[i]);
    cudaFree(out[i]);
  }
  std::printf("graph: %d replays correct\ngraph: ok\n", kReplays);
  return 0;
}

// A rank waiting in an AllReduce whose peer is gone: its stream must drain
// within 60 s and its communicator report an asynchronous error.
void expectReleased(ncclComm_t comm, cudaStream_t s, const char* how) {
  if (!drains(s, 60)) fail(std::string(how) + ": the waiting rank's stream is still held after 60 s");
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 600 && async == ncclSuccess; ++i) {
    ncclCommGetAsyncError(comm, &async);
    if (async == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (async == ncclSuccess) fail(std::string(how) + ": no asynchronous error on the waiting rank");
  std::printf("%s: %s: stream released, error: %s\n", gMode.c_str(), how, ncclGetLastError(comm));
}

int abortCheck() {
  constexpr size_t kCount = 1 << 16;
  float* buf = deviceFloats(kCount, 1);
  {
    Ranks r(2);
    nccl(ncclAllReduce(buf, buf, kCount, ncclFloat, ncclSum, r.comms[0], r.streams[0]), "ncclAllReduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    nccl(ncclCommAbort(r.comms[1]), "ncclCommAbort");
    r.comms[1] = nullptr;
    expectReleased(r.comms[0], r.streams[0], "the peer aborted");
  }
  {
    Ranks r(2);
    nccl(ncclAllReduce(buf, buf, kCount, ncclFloat, ncclSum, r.comms[0], r.streams[0]), "ncclAllReduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    nccl(ncclCommAbort(r.comms[0]), "ncclCommAbort");
    r.comms[0] = nullptr;
    if (!drains(r.streams[0], 60)) fail("ncclCommAbort of the waiting rank did not release its stream");
    std::printf("abort: the rank's own abort released its stream\n");
  }
  cudaFree(buf);
  std::printf("abort: ok\n");
  return 0;
}

int killCheck() {
  // Neither side waits the default 300 s for a peer that never came (a
  // child without a device exits at once).
  setenv("LOOM_INIT_TIMEOUT_S", "30", 0);
  ncclUniqueId id;
  nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  // Fork before either process touches CUDA.
  const pid_t child = fork();
  if (child < 0) fail("fork");
  if (child == 0) {
    ncclComm_t c = nullptr;
    if (cudaSetDevice(0) != cudaSuccess || ncclCommInitRank(&c, 2, id, 1) != ncclSuccess) _exit(3);
    sleep(1);  // the parent's init has finished by now
    kill(getpid(), SIGKILL);
    _exit(4);
  }
  ncclComm_t comm = nullptr;
  nccl(ncclCommInitRank(&comm, 2, id, 0), "ncclCommInitRank");
  cudaStream_t s;
  cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  float* buf = deviceFloats(1 << 16, 1);
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) fail("the peer did not die by SIGKILL");
  nccl(ncclAllReduce(buf, buf, 1 << 16, ncclFloat, ncclSum, comm, s), "ncclAllReduce");
  expectReleased(comm, s, "the peer was killed");
  ncclCommAbort(comm);
  cudaStreamDestroy(s);
  cudaFree(buf);
  std::printf("kill: ok\n");
  return 0;
}

template <typename F>
double medianSeconds(cudaStream_t s, int reps, F launch) {
  cudaEvent_t a, b;
  cuda(cudaEventCreate(&a), "cudaEventCreate");
  cuda(cudaEventCreate(&b), "cudaEventCreate");
  launch();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    cuda(cudaEventRecord(a, s), "cudaEventRecord");
    launch();
    cuda(cudaEventRecord(b, s), "cudaEventRecord");
    cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int bench() {
  constexpr size_t kBytes = size_t(256) << 20;
  void *a, *b, *c;
  for (void** p : {&a, &b, &c}) {
    cuda(cudaMalloc(p, kBytes), "cudaMalloc");
    cuda(cudaMemset(*p, 0x3c, kBytes), "cudaMemset");  // finite in float and bfloat16
  }
  cudaStream_t s;
  cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  const double copy = medianSeconds(s, 10, [&] {
    cuda(cudaMemcpyAsync(c, a, kBytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  });
  const double C = kBytes / copy;
  std::printf("bench: device-to-device copy of 256 MiB: C = %.1f GB/s (read + written: %.1f GB/s)\n", C / 1e9,
              2 * C / 1e9);
  bool missed = false;
  for (auto [type, name] : {std::pair{loom::kernels::DataType::kFloat32, "float"},
                            std::pair{loom::kernels::DataType::kBfloat16, "bfloat16"}}) {
    loom::kernels::Reduction r{type, loom::kernels::RedOp::kSum};
    const void* sources[2] = {a, b};
    const size_t count = kBytes / loom::kernels::dataTypeSize(type);
    const double t = medianSeconds(s, 10, [&] {
      if (!loom::kernels::cuda::reduce(r, c, sources, 2, nullptr, count, false, s).isOk()) fail("reduce launch");
    });
    const double rate = 3.0 * kBytes / t;
    const double ratio = rate / (2 * C);
    std::printf("bench: reduce %s, 2 sources, 256 MiB: %.1f GB/s read + written = %.3f x the copy's (target >= 0.9)\n",
                name, rate / 1e9, ratio);
    missed = missed || ratio < 0.9;
  }
  {
    Ranks ranks(2);
    // Rank 0 out of place into c, rank 1 in place on b.
    float* in[2] = {static_cast<float*>(a), static_cast<float*>(b)};
    float* out[2] = {static_cast<float*>(c), static_cast<float*>(b)};
    const size_t count = kBytes / sizeof(float);
    allReduceBoth(ranks, in, out, count);  // warm-up (and connections)
    for (auto st : ranks.streams) cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      auto t = Clock::now();
      allReduceBoth(ranks, in, out, count);
      for (auto st : ranks.streams) cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
      times.push_back(secondsSince(t));
    }
    std::sort(times.begin(), times.end());
    const double busbw = kBytes / times[times.size() / 2];  // 2 ranks: busbw = algbw
    std::printf("bench: AllReduce float 256 MiB, 2 ranks on this GPU: busbw %.1f GB/s = %.3f x C (target >= 0.35)\n",
                busbw / 1e9, busbw / C);
    missed = missed || busbw / C < 0.35;
  }
  cudaStreamDestroy(s);
  for (void* p : {a, b, c}) cudaFree(p);
  if (missed) miss("a bandwidth target was missed (figures above)");
  std::printf("bench: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s latency|graph|abort|kill|bench\n", argv[0]);
    return 2;
  }
  gMode = argv[1];
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line reaches the log at once, also before a hang
  if (gMode == "kill") return killCheck();  // forks before CUDA is touched
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) fail("no CUDA device");
  cuda(cudaSetDevice(0), "cudaSetDevice");
  if (gMode == "latency") return latency();
  if (gMode == "graph") return graph();
  if (gMode == "abort") return abortCheck();
  if (gMode == "bench") return bench();
  std::fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
