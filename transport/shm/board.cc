#include "transport/shm/board.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "common/asymmetric_fence.h"
#include "common/cpu_relax.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace loom::transport::shm {
namespace {

constexpr uint32_t kBoardVersion = 6;  // 6: cells
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// Page 0: header; page 1: one line per member; then the inline lines
// (kBoardInlineSlots per member, whole pages); then the cells (kBoardCells
// per member, whole pages); then the slots.
struct BoardHeader {
  uint64_t magic;
  uint64_t nonce;
  uint64_t slotBytes;
  uint32_t members;
  uint32_t version;
};

size_t wholePages(size_t bytes) { return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes; }

size_t cellOffset(int members) { return 2 * kPageBytes + wholePages(size_t(members) * kBoardInlineSlots * 64); }

size_t dataOffset(int members) { return cellOffset(members) + wholePages(size_t(members) * kBoardCells * 16); }

size_t layoutBytes(int members, size_t slotBytes) {
  return dataOffset(members) + size_t(members) * kBoardSlots * slotBytes;
}

Status boardError(const std::string& what, int err) {
  return systemError("the shared-memory board: " + what + " failed: " + errnoText(err));
}

// The futex word: the low 32 bits of a sequence word.
uint32_t* low(std::atomic<uint64_t>* word) {
  static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big);
  return reinterpret_cast<uint32_t*>(word) + (std::endian::native == std::endian::little ? 0 : 1);
}

long futex(std::atomic<uint64_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, low(word), op, value, timeout, nullptr, 0);
}

}  // namespace

Result<Board> Board::create(int members, size_t slotBytes) {
  if (members < 1 || members > kBoardMaxMembers || slotBytes == 0 || slotBytes % kPageBytes != 0)
    return invalidArgument("a shared-memory board needs 1.." + std::to_string(kBoardMaxMembers) +
                           " members and whole pages per slot");
  const size_t total = layoutBytes(members, slotBytes);
  Board b;
  b.memfd_.reset(::memfd_create("loom-shm-board", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!b.memfd_) return boardError("memfd_create", errno);
  const int fd = b.memfd_.get();
  if (::ftruncate(fd, off_t(total)) != 0) return boardError("ftruncate to " + std::to_string(total) + " bytes", errno);
  bool populate = false;
  if (::fallocate(fd, 0, 0, off_t(total)) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) return boardError("fallocate of " + std::to_string(total) + " bytes", err);
    populate = true;
  }
  if (::fcntl(fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) return boardError("sealing", errno);
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) return boardError("mmap", errno);
  b.map_ = Mapping(p, total);
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof nonce, 0) != ssize_t(sizeof nonce)) nonce = uint64_t(::getpid()) << 20 ^ uint64_t(time(nullptr));
  // Fresh memfd pages are zero: every sequence starts at 0.
  auto* h = static_cast<BoardHeader*>(p);
  h->magic = kBoardDescriptorMagic;
  h->nonce = nonce;
  h->slotBytes = slotBytes;
  h->members = uint32_t(members);
  h->version = kBoardVersion;
  std::atomic_thread_fence(std::memory_order_release);
  b.members_ = members;
  b.slotBytes_ = slotBytes;
  b.cellOffset_ = cellOffset(members);
  b.dataOffset_ = dataOffset(members);
  b.nonce_ = nonce;
  b.leaderPid_ = int32_t(::getpid());
  return b;
}

BoardDescriptor Board::describe() const {
  BoardDescriptor d;
  d.magic = kBoardDescriptorMagic;
  d.nonce = nonce_;
  d.bytes = map_.bytes();
  d.slotBytes = slotBytes_;
  d.pid = leaderPid_;
  d.memfd = memfd_.get();
  d.members = members_;
  d.version = kBoardVersion;
  return d;
}

Result<Board> Board::open(const BoardDescriptor& d) {
  if (d.magic != kBoardDescriptorMagic || d.version != kBoardVersion)
    return remoteError("the shared-memory board's descriptor is not understood: run the same loom build on all ranks");
  if (d.members < 1 || d.members > kBoardMaxMembers || d.slotBytes == 0 || d.slotBytes % kPageBytes != 0 ||
      d.bytes != layoutBytes(d.members, size_t(d.slotBytes)) || d.pid <= 0 || d.memfd < 0)
    return remoteError("malformed shared-memory board descriptor");
  const std::string path = "/proc/" + std::to_string(d.pid) + "/fd/" + std::to_string(d.memfd);
  net::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) return boardError("opening " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return boardError("fstat of " + path, errno);
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || uint64_t(st.st_size) != d.bytes || seals < 0 || (unsigned(seals) & kSeals) != kSeals)
    return remoteError(path + " is not the announced board (a sealed memfd of " + std::to_string(d.bytes) + " bytes)");
  void* p = ::mmap(nullptr, d.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return boardError("mmap", errno);
  Board b;
  b.map_ = Mapping(p, d.bytes);
  std::atomic_thread_fence(std::memory_order_acquire);
  BoardHeader h;
  std::memcpy(&h, p, sizeof h);
  if (h.magic != kBoardDescriptorMagic || h.nonce != d.nonce || h.slotBytes != d.slotBytes ||
      h.members != uint32_t(d.members) || h.version != kBoardVersion)
    return remoteError(path + " does not hold the announced board (its header differs)");
  b.members_ = d.members;
  b.slotBytes_ = size_t(d.slotBytes);
  b.cellOffset_ = cellOffset(d.members);
  b.dataOffset_ = dataOffset(d.members);
  b.nonce_ = d.nonce;
  b.leaderPid_ = d.pid;
  return b;
}

void Board::join(int member) {
  member_ = member;
  line(member)->pid.store(int32_t(::getpid()), std::memory_order_release);
}

void Board::leave() {
  if (!valid() || member_ < 0) return;
  Line* l = line(member_);
  l->closed.store(1, std::memory_order_seq_cst);
  if (l->waiters.load(std::memory_order_seq_cst) != 0) futex(&l->seq, FUTEX_WAKE, INT_MAX, nullptr);
  member_ = -1;
}

Board& Board::operator=(Board&& other) noexcept {
  if (this == &other) return *this;
  leave();
  map_ = std::move(other.map_);
  members_ = other.members_;
  slotBytes_ = other.slotBytes_;
  cellOffset_ = other.cellOffset_;
  dataOffset_ = other.dataOffset_;
  nonce_ = other.nonce_;
  leaderPid_ = other.leaderPid_;
  member_ = std::exchange(other.member_, -1);
  asymmetric_ = other.asymmetric_;
  memfd_ = std::move(other.memfd_);
  pidfds_ = std::move(other.pidfds_);
  return *this;
}

void Board::watchMembers() {
  pidfds_.clear();
  for (int m = 0; m < members_; ++m) {
    const int32_t pid = line(m)->pid.load(std::memory_order_acquire);
    pidfds_.emplace_back(pid > 0 && pid != ::getpid() ? int(::syscall(SYS_pidfd_open, pid, 0)) : -1);
  }
}

bool Board::alive(int m) const {
  if (size_t(m) >= pidfds_.size() || !pidfds_[size_t(m)]) return true;
  pollfd p{pidfds_[size_t(m)].get(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;  // readable: the process has exited
}

void Board::publish(int member, uint64_t seq) const {
  Line* l = line(member);
  // Store, fence, then look at `waiters`: a sleeper that counted itself
  // before its last look at the word is always seen (wait() mirrors it).
  // The full fence would wait for every store of this operation to reach
  // its cache line, its inline data among them, which the reader may hold:
  // a transfer's latency on every call of a tiny operation.
  l->seq.store(seq, std::memory_order_release);
  if (asymmetric_) AsymmetricFence::light(FenceScope::kProcesses);
  else std::atomic_thread_fence(std::memory_order_seq_cst);
  if (l->waiters.load(std::memory_order_relaxed) != 0) futex(&l->seq, FUTEX_WAKE, INT_MAX, nullptr);
}

bool Board::waitInline(InlinePlace p, int m, uint64_t at, uint64_t seq, int spins) const {
  for (int i = 0; i < spins; ++i) {
    if (inlineStamped(p, m, at, seq)) return true;
    cpuRelax();
  }
  return inlineStamped(p, m, at, seq);
}

bool Board::wait(int m, uint64_t want, int spins, int sleepMs) const {
  Line* l = line(m);
  for (int i = 0; i < spins; ++i) {
    if (l->seq.load(std::memory_order_acquire) >= want) return true;
    cpuRelax();
  }
  if (sleepMs <= 0) return l->seq.load(std::memory_order_acquire) >= want;
  l->waiters.fetch_add(1, std::memory_order_seq_cst);
  // Should the membarrier fail, a wake-up may be missed: the sleep is
  // bounded by sleepMs.
  if (asymmetric_) (void)AsymmetricFence::heavy(FenceScope::kProcesses);
  const uint64_t seen = l->seq.load(std::memory_order_seq_cst);
  if (seen < want) {
    timespec ts{sleepMs / 1000, long(sleepMs % 1000) * 1000000L};
    futex(&l->seq, FUTEX_WAIT, uint32_t(seen), &ts);
  }
  l->waiters.fetch_sub(1, std::memory_order_seq_cst);
  return l->seq.load(std::memory_order_acquire) >= want;
}

}  // namespace loom::transport::shm
