// libibverbs, loaded at run time.
//
// loom links no verbs library: libibverbs.so.1 is opened with dlopen on
// first use, so the library loads and runs where rdma-core is absent (the
// verbs backend then says why it cannot be used). The header comes from
// Debian's libibverbs-dev at build time; its inline helpers that go through
// a context's ops table (ibv_poll_cq, ibv_post_send, ibv_post_recv,
// ibv_req_notify_cq) are called directly, everything else only through the
// pointers below. Never call an exported ibv_* function by name in loom:
// that would make libibverbs a link-time dependency again.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace loom::transport::ib {

struct Verbs {
  decltype(&::ibv_get_device_list) getDeviceList;
  decltype(&::ibv_free_device_list) freeDeviceList;
  decltype(&::ibv_get_device_name) getDeviceName;
  decltype(&::ibv_open_device) openDevice;
  decltype(&::ibv_close_device) closeDevice;
  decltype(&::ibv_query_device) queryDevice;
  decltype(&::ibv_query_port) queryPort;
  decltype(&::ibv_query_gid) queryGid;
  decltype(&::ibv_alloc_pd) allocPd;
  decltype(&::ibv_dealloc_pd) deallocPd;
  decltype(&::ibv_reg_mr) regMr;
  decltype(&::ibv_dereg_mr) deregMr;
  decltype(&::ibv_create_comp_channel) createCompChannel;
  decltype(&::ibv_destroy_comp_channel) destroyCompChannel;
  decltype(&::ibv_create_cq) createCq;
  decltype(&::ibv_destroy_cq) destroyCq;
  decltype(&::ibv_get_cq_event) getCqEvent;
  decltype(&::ibv_ack_cq_events) ackCqEvents;
  decltype(&::ibv_create_qp) createQp;
  decltype(&::ibv_modify_qp) modifyQp;
  decltype(&::ibv_query_qp) queryQp;
  decltype(&::ibv_destroy_qp) destroyQp;
  decltype(&::ibv_get_async_event) getAsyncEvent;
  decltype(&::ibv_ack_async_event) ackAsyncEvent;
  decltype(&::ibv_wc_status_str) wcStatusStr;
  decltype(&::ibv_event_type_str) eventTypeStr;
  // Optional (rdma-core 34 and later; null before): GPUDirect registration.
  using RegDmabufMr = ibv_mr* (*)(ibv_pd*, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
  RegDmabufMr regDmabufMr;
  // Optional (libibverbs 1.8 and later): registration that passes the
  // optional access flags on (IBV_ACCESS_RELAXED_ORDERING).
  using RegMrIova2 = ibv_mr* (*)(ibv_pd*, void* addr, size_t length, uint64_t iova, unsigned int access);
  RegMrIova2 regMrIova2;
};

// The loaded library, or null with *why saying what is missing (no
// libibverbs.so.1, a symbol it lacks). Loaded once per process; never
// unloaded (providers keep threads and state of their own). Loading calls
// ibv_fork_init, so registered memory stays with the adapter when the
// process forks (a no-op on kernels that handle it themselves).
const Verbs* verbs(std::string* why = nullptr);

// NCCL_IB_PCI_RELAXED_ORDERING: whether memory registrations ask for PCIe
// relaxed ordering (IBV_ACCESS_RELAXED_ORDERING, an optional flag: devices
// and platforms without it ignore it). 0: never; 1 and 2 (the default):
// where libibverbs passes optional flags on (ibv_reg_mr_iova2), 1 warning
// once where it cannot. Arrival is signalled by completions, which the
// adapter orders after the data, so relaxed data writes are safe. *why
// (optional) says why not.
bool relaxedOrdering(const Verbs& v, std::string* why = nullptr);
// The access flags to register with: `access`, plus relaxed ordering where
// relaxedOrdering().
int accessFlags(const Verbs& v, int access);
// ibv_reg_mr with accessFlags(access).
ibv_mr* regMemory(const Verbs& v, ibv_pd* pd, void* addr, size_t length, int access);

// ibv_query_port as the header's inline wrapper does it: through the
// context's extended op where the provider has one, else the exported
// (compat) entry point.
int queryPort(const Verbs& v, ibv_context* context, uint8_t port, ibv_port_attr* attr);

// Text for a work completion status / an async event (works whether or not
// the library loaded).
std::string wcStatusText(int status);
std::string eventText(int type);

}  // namespace loom::transport::ib
