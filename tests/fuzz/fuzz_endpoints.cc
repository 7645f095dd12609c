// Fuzz target `endpoints`: the versioned blobs ranks trade during setup, as
// their readers see them (transport/endpoint.h's rules):
//   mode 0: a shared-memory endpoint (shm::readEndpoint), from the offer of
//           a peer that wants to attach;
//   mode 1: one rank's info (wire::decodeRankInfo), from a join request or
//           a split;
//   mode 2: a table of them (wire::decodeTable) for 1-8 ranks, from the
//           rendezvous root;
//   mode 3: a CUDA IPC endpoint (cudaipc::readEndpoint), from the offer of
//           a peer that wants to map its device inbox;
//   mode 4: a verbs endpoint (ib::readEndpoint), from the offer of a peer
//           that wants to write into this rank's FIFO (builds with
//           libibverbs-dev only; otherwise refused unread).
// A reader either refuses (kRemoteError with a message) or accepts a blob
// that its writer produces byte for byte from what was read: nothing
// unread rides along, nothing is read out of bounds (ASan).
//
// Input: [mode : u8 % 5] ([nranks - 1 : u8 % 8] for mode 2, [expected slot
// stride : u32] for mode 4) then the blob.
#include <algorithm>
#include <span>
#include <vector>

#include "core/wire.h"
#include "fuzz_input.h"
#include "transport/cudaipc/endpoint.h"
#include "transport/shm/endpoint.h"
#if LOOM_HAVE_VERBS
#include "transport/ib/connection.h"
#include "transport/ib/endpoint.h"
#endif

namespace {

using namespace loom;

template <typename R>
bool refused(const R& r) {
  if (r.isOk()) return false;
  FUZZ_CHECK(r.status().code() == Code::kRemoteError && !r.status().message().empty());
  FUZZ_TRACE("refused: %s\n", r.status().message().c_str());
  return true;
}

bool same(const std::vector<uint8_t>& a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int mode = in.u8() % 5;
  const int nranks = mode == 2 ? 1 + in.u8() % 8 : 0;
  const uint32_t stride = mode == 4 ? in.u32() : 0;
  const std::string_view rest = in.rest();
  const std::span<const uint8_t> blob(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  if (mode == 0) {
    auto d = transport::shm::readEndpoint(blob);
    if (refused(d)) return 0;
    std::vector<uint8_t> again;
    transport::shm::writeEndpoint(*d, &again);
    FUZZ_CHECK(same(again, blob));
  } else if (mode == 1) {
    auto info = core::wire::decodeRankInfo(blob);
    if (refused(info)) return 0;
    FUZZ_CHECK(info->hostname.size() <= core::wire::kMaxHostnameBytes);
    FUZZ_CHECK(same(core::wire::encode(*info), blob));
  } else if (mode == 4) {
#if LOOM_HAVE_VERBS
    auto e = transport::ib::readEndpoint(blob, transport::ib::kSlots, stride);
    if (refused(e)) return 0;
    FUZZ_CHECK(!e->qpns.empty() && e->qpns.size() <= transport::ib::kMaxQps && e->slotStride == stride);
    std::vector<uint8_t> again;
    transport::ib::writeEndpoint(*e, &again);
    FUZZ_CHECK(same(again, blob));
#endif
  } else if (mode == 3) {
    auto d = transport::cudaipc::readEndpoint(blob);
    if (refused(d)) return 0;
    std::vector<uint8_t> again;
    transport::cudaipc::writeEndpoint(*d, &again);
    FUZZ_CHECK(same(again, blob));
  } else {
    auto table = core::wire::decodeTable(blob, nranks);
    if (refused(table)) return 0;
    FUZZ_CHECK(table->size() == size_t(nranks));
    std::vector<uint8_t> again;
    for (const auto& info : *table) core::wire::appendTableEntry(core::wire::encode(info), &again);
    FUZZ_CHECK(same(again, blob));
  }
  return 0;
}
