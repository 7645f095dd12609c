#include "transport/ib/verbs.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/settings.h"

namespace loom::transport::ib {
namespace {

struct Loaded {
  Verbs table{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool resolve(void* lib, const char* name, F* slot, std::string* why) {
  // The default version of a versioned symbol (IBVERBS_1.1 over 1.0).
  *slot = reinterpret_cast<F>(::dlsym(lib, name));
  if (*slot) return true;
  if (why->empty()) *why = std::string("libibverbs.so.1 lacks ") + name + " (rdma-core too old?)";
  return false;
}

Loaded load() {
  Loaded l;
  void* lib = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    l.why = std::string("cannot load libibverbs.so.1 (install rdma-core's libibverbs1 and a provider package): ") +
            (e ? e : "unknown error");
    return l;
  }
  Verbs& v = l.table;
  bool ok = true;
#define LOOM_VERBS_SYMBOL(member, symbol) ok = resolve(lib, #symbol, &v.member, &l.why) && ok
  LOOM_VERBS_SYMBOL(getDeviceList, ibv_get_device_list);
  LOOM_VERBS_SYMBOL(freeDeviceList, ibv_free_device_list);
  LOOM_VERBS_SYMBOL(getDeviceName, ibv_get_device_name);
  LOOM_VERBS_SYMBOL(openDevice, ibv_open_device);
  LOOM_VERBS_SYMBOL(closeDevice, ibv_close_device);
  LOOM_VERBS_SYMBOL(queryDevice, ibv_query_device);
  LOOM_VERBS_SYMBOL(queryPort, ibv_query_port);
  LOOM_VERBS_SYMBOL(queryGid, ibv_query_gid);
  LOOM_VERBS_SYMBOL(allocPd, ibv_alloc_pd);
  LOOM_VERBS_SYMBOL(deallocPd, ibv_dealloc_pd);
  LOOM_VERBS_SYMBOL(regMr, ibv_reg_mr);
  LOOM_VERBS_SYMBOL(deregMr, ibv_dereg_mr);
  LOOM_VERBS_SYMBOL(createCompChannel, ibv_create_comp_channel);
  LOOM_VERBS_SYMBOL(destroyCompChannel, ibv_destroy_comp_channel);
  LOOM_VERBS_SYMBOL(createCq, ibv_create_cq);
  LOOM_VERBS_SYMBOL(destroyCq, ibv_destroy_cq);
  LOOM_VERBS_SYMBOL(getCqEvent, ibv_get_cq_event);
  LOOM_VERBS_SYMBOL(ackCqEvents, ibv_ack_cq_events);
  LOOM_VERBS_SYMBOL(createQp, ibv_create_qp);
  LOOM_VERBS_SYMBOL(modifyQp, ibv_modify_qp);
  LOOM_VERBS_SYMBOL(queryQp, ibv_query_qp);
  LOOM_VERBS_SYMBOL(destroyQp, ibv_destroy_qp);
  LOOM_VERBS_SYMBOL(getAsyncEvent, ibv_get_async_event);
  LOOM_VERBS_SYMBOL(ackAsyncEvent, ibv_ack_async_event);
  LOOM_VERBS_SYMBOL(wcStatusStr, ibv_wc_status_str);
  LOOM_VERBS_SYMBOL(eventTypeStr, ibv_event_type_str);
#undef LOOM_VERBS_SYMBOL
  v.regDmabufMr = reinterpret_cast<Verbs::RegDmabufMr>(::dlsym(lib, "ibv_reg_dmabuf_mr"));
  v.regMrIova2 = reinterpret_cast<Verbs::RegMrIova2>(::dlsym(lib, "ibv_reg_mr_iova2"));
  l.ok = ok;
  // Before any other verbs call. Its failure only means fork safety is the
  // kernel's business (as it is since Linux 5.13).
  if (auto forkInit = reinterpret_cast<decltype(&::ibv_fork_init)>(::dlsym(lib, "ibv_fork_init")); ok && forkInit)
    forkInit();
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const Verbs* verbs(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.table : nullptr;
}

bool relaxedOrdering(const Verbs& v, std::string* why) {
  static const int64_t wanted = settings::current()->getInt("NCCL_IB_PCI_RELAXED_ORDERING");
  if (wanted <= 0) {
    if (why) *why = "NCCL_IB_PCI_RELAXED_ORDERING=0";
    return false;
  }
  if (!v.regMrIova2) {
    static std::once_flag warned;
    if (wanted == 1) std::call_once(warned, [] { LOOM_WARN("NCCL_IB_PCI_RELAXED_ORDERING=1: libibverbs has no ibv_reg_mr_iova2 (before 1.8), so registrations use strict ordering"); });
    if (why) *why = "libibverbs has no ibv_reg_mr_iova2";
    return false;
  }
  return true;
}

int accessFlags(const Verbs& v, int access) {
  return relaxedOrdering(v) ? access | IBV_ACCESS_RELAXED_ORDERING : access;
}

ibv_mr* regMemory(const Verbs& v, ibv_pd* pd, void* addr, size_t length, int access) {
  if (!relaxedOrdering(v)) return v.regMr(pd, addr, length, access);
  return v.regMrIova2(pd, addr, length, uint64_t(reinterpret_cast<uintptr_t>(addr)),
                      unsigned(access | IBV_ACCESS_RELAXED_ORDERING));
}

int queryPort(const Verbs& v, ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  if (verbs_context* extended = verbs_get_ctx_op(context, query_port))
    return extended->query_port(context, port, attr, sizeof *attr);
  std::memset(attr, 0, sizeof *attr);
  return v.queryPort(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

std::string wcStatusText(int status) {
  const Verbs* v = verbs();
  std::string text = v ? v->wcStatusStr(ibv_wc_status(status)) : "work completion error";
  return text + " (status " + std::to_string(status) + ")";
}

std::string eventText(int type) {
  const Verbs* v = verbs();
  std::string text = v ? v->eventTypeStr(ibv_event_type(type)) : "async event";
  return text + " (event " + std::to_string(type) + ")";
}

}  // namespace loom::transport::ib
