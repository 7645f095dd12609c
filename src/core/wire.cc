#include "core/wire.h"

#include <algorithm>

#include "transport/endpoint.h"

namespace loom::core::wire {

std::vector<uint8_t> encode(const RankInfo& info) {
  std::vector<uint8_t> out;
  transport::EndpointWriter w(&out, kRankInfoVersion);
  w.putBytes(info.listenAddr, sizeof info.listenAddr);
  w.put(info.pid);
  w.put(info.hostHash);
  w.put(info.mode);
  w.put(info.cudaDevice);
  w.putString(std::string_view(info.gpuUuid).substr(0, kMaxUuidBytes));
  w.put(uint32_t(info.numa));
  auto putPath = [&](const std::vector<std::string>& path) {
    const size_t n = std::min(path.size(), kMaxPciDepth);
    w.put(uint32_t(n));
    for (size_t i = 0; i < n; ++i) w.putString(std::string_view(path[i]).substr(0, kMaxNameBytes));
  };
  putPath(info.pciPath);
  const size_t nics = std::min(info.nics.size(), kMaxNics);
  w.put(uint32_t(nics));
  for (size_t i = 0; i < nics; ++i) {
    const auto& nic = info.nics[i];
    w.putString(std::string_view(nic.name).substr(0, kMaxNameBytes));
    w.put(uint64_t(nic.speedMbps));
    w.put(uint32_t(nic.numa));
    putPath(nic.pciPath);
  }
  w.putString(std::string_view(info.hostname).substr(0, kMaxHostnameBytes));
  w.put(info.transports);
  w.put(info.flags);
  const size_t words = std::min(info.cpuMask.size(), kMaxCpuWords);
  w.put(uint32_t(words));
  for (size_t i = 0; i < words; ++i) w.put(info.cpuMask[i]);
  w.put(info.channels);
  return out;
}

Result<RankInfo> decodeRankInfo(std::span<const uint8_t> blob) {
  if (blob.size() > kMaxRankInfoBytes) return remoteError("the peer sent an oversized rank info");
  transport::EndpointReader r(blob, "rank info");
  LOOM_TRY(r.expectVersion(kRankInfoVersion));
  RankInfo info;
  r.getBytes(info.listenAddr, sizeof info.listenAddr);
  r.get(&info.pid);
  r.get(&info.hostHash);
  r.get(&info.mode);
  r.get(&info.cudaDevice);
  r.getString(&info.gpuUuid, kMaxUuidBytes);
  uint32_t numa = 0;
  r.get(&numa);
  info.numa = int32_t(numa);
  // Counts are checked before anything is allocated for them; a read that
  // runs short is reported by finish().
  bool tooMany = false;
  auto getPath = [&](std::vector<std::string>* path) {
    uint32_t n = 0;
    if (!r.get(&n)) return false;
    if (n > kMaxPciDepth) return !(tooMany = true);
    path->resize(n);
    for (auto& id : *path) {
      if (!r.getString(&id, kMaxNameBytes)) return false;
    }
    return true;
  };
  bool ok = getPath(&info.pciPath);
  uint32_t nics = 0;
  ok = ok && r.get(&nics);
  if (ok && nics > kMaxNics) ok = !(tooMany = true);
  if (ok) info.nics.resize(nics);
  for (size_t i = 0; ok && i < info.nics.size(); ++i) {
    auto& nic = info.nics[i];
    uint32_t nicNuma = 0;
    ok = r.getString(&nic.name, kMaxNameBytes) && r.get(&nic.speedMbps) && r.get(&nicNuma) && getPath(&nic.pciPath);
    nic.numa = int32_t(nicNuma);
  }
  if (tooMany) return remoteError("the peer sent a rank info with too many PCI levels or NICs");
  if (!ok) {
    LOOM_TRY(r.finish());
    return remoteError("the peer sent a malformed rank info");
  }
  uint32_t words = 0;
  if (r.getString(&info.hostname, kMaxHostnameBytes) && r.get(&info.transports) && r.get(&info.flags) &&
      r.get(&words)) {
    if (words > kMaxCpuWords) return remoteError("the peer sent a rank info with too large a CPU mask");
    info.cpuMask.resize(words);
    for (uint64_t& w : info.cpuMask) r.get(&w);
    r.get(&info.channels);
  }
  LOOM_TRY(r.finish());
  return info;
}

void appendTableEntry(std::span<const uint8_t> blob, std::vector<uint8_t>* table) {
  const auto n = uint32_t(blob.size());
  for (int i = 0; i < 4; ++i) table->push_back(uint8_t(n >> (8 * i)));
  table->insert(table->end(), blob.begin(), blob.end());
}

Result<std::vector<RankInfo>> decodeTable(std::span<const uint8_t> table, int nranks) {
  std::vector<RankInfo> out;
  out.reserve(size_t(nranks));
  size_t at = 0;
  for (int r = 0; r < nranks; ++r) {
    if (table.size() - at < 4) return remoteError("the table of ranks ends before rank " + std::to_string(r));
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= uint32_t(table[at + size_t(i)]) << (8 * i);
    at += 4;
    if (n > kMaxRankInfoBytes || table.size() - at < n) {
      return remoteError("the table of ranks has a bad entry for rank " + std::to_string(r));
    }
    auto info = decodeRankInfo(table.subspan(at, n));
    if (!info.isOk()) return info.takeStatus().addContext("rank " + std::to_string(r) + "'s entry");
    out.push_back(std::move(info.value()));
    at += n;
  }
  if (at != table.size()) return remoteError("the table of ranks has " + std::to_string(table.size() - at) +
                                             " unexpected trailing bytes");
  return out;
}

}  // namespace loom::core::wire
