// GPUs and NVLinks through NVML (libnvidia-ml.so.1, part of the driver),
// loaded with dlopen. The few types used are declared here as NVML's public
// ABI defines them; the CUDA toolkit does not ship nvml.h.
#include <dlfcn.h>

#include <cstdio>
#include <memory>

#include "topology/detect_internal.h"

namespace loom::topology::detail {
namespace {

using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlPciInfo {  // nvmlPciInfo_t, as filled by the _v3 call
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kMaxNvLinks = 18;
// nvmlNvLinkDeviceType_t: 0 GPU, 1 IBM NPU, 2 switch, 0xFF unknown.
constexpr int kNvLinkDeviceGpu = 0;
constexpr int kNvLinkDeviceSwitch = 2;

struct LibraryCloser {
  void operator()(void* h) const { dlclose(h); }
};

template <typename F>
bool bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

std::vector<GpuInfo> nvmlGpus() {
  std::unique_ptr<void, LibraryCloser> lib(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL));
  if (!lib) return {};
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, NvmlDevice*) = nullptr;
  int (*pciInfo)(NvmlDevice, NvmlPciInfo*) = nullptr;
  int (*capability)(NvmlDevice, int*, int*) = nullptr;
  int (*linkState)(NvmlDevice, unsigned, int*) = nullptr;
  int (*remotePci)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  int (*remoteType)(NvmlDevice, unsigned, int*) = nullptr;  // newer drivers only
  void* l = lib.get();
  if (!bind(l, "nvmlInit_v2", &init) || !bind(l, "nvmlShutdown", &shutdown) ||
      !bind(l, "nvmlDeviceGetCount_v2", &count) || !bind(l, "nvmlDeviceGetHandleByIndex_v2", &handle) ||
      !bind(l, "nvmlDeviceGetPciInfo_v3", &pciInfo) ||
      !bind(l, "nvmlDeviceGetCudaComputeCapability", &capability)) {
    return {};
  }
  bind(l, "nvmlDeviceGetNvLinkState", &linkState);
  bind(l, "nvmlDeviceGetNvLinkRemotePciInfo_v2", &remotePci);
  bind(l, "nvmlDeviceGetNvLinkRemoteDeviceType", &remoteType);
  if (init() != 0) return {};
  std::vector<GpuInfo> gpus;
  std::vector<NvmlDevice> handles;
  unsigned n = 0;
  if (count(&n) == 0) {
    for (unsigned i = 0; i < n && i < 1024; ++i) {
      NvmlDevice d = nullptr;
      NvmlPciInfo pci{};
      if (handle(i, &d) != 0 || pciInfo(d, &pci) != 0) continue;
      GpuInfo g;
      g.busId = normalizeBusId(pci.busId);
      g.dev = int(i);
      int major = 0, minor = 0;
      if (capability(d, &major, &minor) == 0) g.sm = major * 10 + minor;
      gpus.push_back(std::move(g));
      handles.push_back(d);
    }
  }
  for (size_t i = 0; i < gpus.size() && linkState && remotePci; ++i) {
    for (unsigned link = 0; link < kMaxNvLinks; ++link) {
      int active = 0;
      NvmlPciInfo remote{};
      if (linkState(handles[i], link, &active) != 0 || active != 1) continue;
      if (remotePci(handles[i], link, &remote) != 0) continue;
      const std::string target = normalizeBusId(remote.busId);
      // The driver says what is at the other end where it can; otherwise a
      // GPU of this machine is a GPU and anything else an NVSwitch.
      uint32_t cls = 0x068000;
      for (const auto& other : gpus) {
        if (other.busId == target) cls = 0x030200;
      }
      int type = -1;
      if (remoteType && remoteType(handles[i], link, &type) == 0) {
        if (type == kNvLinkDeviceSwitch) cls = 0x068000;
        if (type == kNvLinkDeviceGpu) cls = 0x030200;
      }
      auto& entry = gpus[i].nvlinks[target];
      entry.first += 1;
      entry.second = cls;
    }
  }
  shutdown();
  return gpus;
}

}  // namespace loom::topology::detail
