// CPUs, caches and the PCI tree through hwloc, loaded with dlopen: loom is
// built against hwloc's headers (for its structures) but never linked to it.
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "topology/detect_internal.h"

#ifdef LOOM_HAVE_HWLOC_HEADERS
#include <hwloc.h>
#endif

namespace loom::topology::detail {

#ifndef LOOM_HAVE_HWLOC_HEADERS

Result<Machine> hwlocMachine() { return internalError("loom was built without hwloc's headers"); }

#else

namespace {

struct Hwloc {
  int (*topologyInit)(hwloc_topology_t*);
  int (*topologyLoad)(hwloc_topology_t);
  void (*topologyDestroy)(hwloc_topology_t);
  int (*setIoTypesFilter)(hwloc_topology_t, enum hwloc_type_filter_e);
  int (*getNbobjsByDepth)(hwloc_topology_t, int);
  hwloc_obj_t (*getObjByDepth)(hwloc_topology_t, int, unsigned);
  int (*bitmapFirst)(hwloc_const_bitmap_t);
  int (*bitmapNext)(hwloc_const_bitmap_t, int);
  int (*bitmapIsincluded)(hwloc_const_bitmap_t, hwloc_const_bitmap_t);
  int (*bitmapIntersects)(hwloc_const_bitmap_t, hwloc_const_bitmap_t);
  unsigned (*getApiVersion)();
  int (*getTypeDepth)(hwloc_topology_t, hwloc_obj_type_t);
};

struct LibraryCloser {
  void operator()(void* h) const { dlclose(h); }
};

template <typename F>
bool bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

std::string busIdOf(unsigned domain, unsigned bus, unsigned dev, unsigned func) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, func);
  return buf;
}


}  // namespace

Result<Machine> hwlocMachine() {
  std::unique_ptr<void, LibraryCloser> lib(dlopen("libhwloc.so.15", RTLD_NOW | RTLD_LOCAL));
  if (!lib) return internalError("hwloc is not available (libhwloc.so.15: " + std::string(dlerror()) + ")");
  Hwloc h{};
  void* l = lib.get();
  if (!bind(l, "hwloc_topology_init", &h.topologyInit) || !bind(l, "hwloc_topology_load", &h.topologyLoad) ||
      !bind(l, "hwloc_topology_destroy", &h.topologyDestroy) ||
      !bind(l, "hwloc_topology_set_io_types_filter", &h.setIoTypesFilter) ||
      !bind(l, "hwloc_get_nbobjs_by_depth", &h.getNbobjsByDepth) ||
      !bind(l, "hwloc_get_obj_by_depth", &h.getObjByDepth) || !bind(l, "hwloc_bitmap_first", &h.bitmapFirst) ||
      !bind(l, "hwloc_bitmap_next", &h.bitmapNext) || !bind(l, "hwloc_bitmap_isincluded", &h.bitmapIsincluded) ||
      !bind(l, "hwloc_bitmap_intersects", &h.bitmapIntersects) ||
      !bind(l, "hwloc_get_api_version", &h.getApiVersion) || !bind(l, "hwloc_get_type_depth", &h.getTypeDepth)) {
    return internalError("hwloc (libhwloc.so.15) lacks a function loom uses");
  }
  if ((h.getApiVersion() >> 16) != (HWLOC_API_VERSION >> 16)) {
    return internalError("hwloc's API version " + std::to_string(h.getApiVersion() >> 16) + ".x differs from " +
                         std::to_string(HWLOC_API_VERSION >> 16) + ".x, which loom was built for");
  }
  hwloc_topology_t raw = nullptr;
  if (h.topologyInit(&raw) != 0) return internalError("hwloc_topology_init failed");
  auto destroy = [&](hwloc_topology_t t) { h.topologyDestroy(t); };
  std::unique_ptr<hwloc_topology, decltype(destroy)> topo(raw, destroy);
  h.setIoTypesFilter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (h.topologyLoad(raw) != 0) return internalError("hwloc_topology_load failed");

  auto objects = [&](int depth) {
    std::vector<hwloc_obj_t> out;
    const int n = h.getNbobjsByDepth(raw, depth);
    for (int i = 0; i < n; ++i) out.push_back(h.getObjByDepth(raw, depth, unsigned(i)));
    return out;
  };
  auto ofType = [&](hwloc_obj_type_t type) {
    const int depth = h.getTypeDepth(raw, type);
    if (depth == HWLOC_TYPE_DEPTH_UNKNOWN || depth == HWLOC_TYPE_DEPTH_MULTIPLE) return std::vector<hwloc_obj_t>{};
    return objects(depth);
  };

  Machine m;
  m.source = "hwloc";
  cpuIdentity(&m);
  const auto numaNodes = ofType(HWLOC_OBJ_NUMANODE);
  for (hwloc_obj_t node : numaNodes) {
    if (!node->cpuset) continue;
    CpuSet set;
    set.numa = int(node->os_index);
    for (int c = h.bitmapFirst(node->cpuset); c >= 0; c = h.bitmapNext(node->cpuset, c)) set.cpus.push_back(c);
    if (set.cpus.empty()) continue;
    for (hwloc_obj_t pkg : ofType(HWLOC_OBJ_PACKAGE)) {
      if (pkg->cpuset && h.bitmapIntersects(pkg->cpuset, node->cpuset)) {
        set.package = int(pkg->os_index);
        break;
      }
    }
    for (hwloc_obj_t core : ofType(HWLOC_OBJ_CORE)) {
      if (core->cpuset && h.bitmapIsincluded(core->cpuset, node->cpuset)) ++set.cores;
    }
    const hwloc_obj_type_t levels[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE};
    for (int i = 0; i < 3; ++i) {
      for (hwloc_obj_t c : ofType(levels[i])) {
        if (c->cpuset && c->attr && h.bitmapIntersects(c->cpuset, node->cpuset)) {
          set.caches.push_back(Cache{i + 1, uint64_t(c->attr->cache.size)});
          break;
        }
      }
    }
    m.numa.push_back(std::move(set));
  }
  if (m.numa.empty()) return internalError("hwloc found no NUMA node with CPUs");

  auto numaOf = [&](hwloc_obj_t obj) {
    while (obj && !obj->cpuset) obj = obj->parent;
    if (!obj) return m.numa[0].numa;
    for (hwloc_obj_t node : numaNodes) {
      if (node->cpuset && h.bitmapIntersects(node->cpuset, obj->cpuset)) return int(node->os_index);
    }
    return m.numa[0].numa;
  };
  // The bus id of the PCI function above `obj`: a PCI bridge, or nothing
  // at a host bridge.
  auto parentOf = [&](hwloc_obj_t obj) -> std::string {
    hwloc_obj_t p = obj->parent;
    if (p && p->type == HWLOC_OBJ_BRIDGE && p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
      const auto& u = p->attr->bridge.upstream.pci;
      return busIdOf(u.domain, u.bus, u.dev, u.func);
    }
    return "";
  };
  auto add = [&](hwloc_obj_t obj, const hwloc_obj_attr_u::hwloc_pcidev_attr_s& a) {
    PciFunction f;
    f.busId = busIdOf(a.domain, a.bus, a.dev, a.func);
    f.parent = parentOf(obj);
    f.numa = numaOf(obj);
    f.cls = uint32_t(a.class_id) << 8;
    f.vendor = a.vendor_id;
    f.device = a.device_id;
    f.subVendor = a.subvendor_id;
    f.subDevice = a.subdevice_id;
    // hwloc gives the link as one GB/s figure; sysfs has NCCL's spelling.
    const std::string dir = "/sys/bus/pci/devices/" + f.busId;
    f.linkSpeed = readLine(dir + "/current_link_speed");
    if (f.linkSpeed.find("Unknown") != std::string::npos) f.linkSpeed.clear();
    f.linkWidth = std::atoi(readLine(dir + "/current_link_width").c_str());
    // The class's programming interface byte is not in hwloc's class_id.
    const std::string cls = readLine(dir + "/class");
    if (!cls.empty()) f.cls = uint32_t(std::strtoul(cls.c_str(), nullptr, 0));
    m.pci.push_back(std::move(f));
  };
  for (hwloc_obj_t obj : objects(HWLOC_TYPE_DEPTH_PCI_DEVICE)) add(obj, obj->attr->pcidev);
  for (hwloc_obj_t obj : objects(HWLOC_TYPE_DEPTH_BRIDGE)) {
    if (obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) add(obj, obj->attr->bridge.upstream.pci);
  }
  return m;
}

#endif

}  // namespace loom::topology::detail
