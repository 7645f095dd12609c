#include "transport/shm/inbox.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <string>

namespace loom::transport::shm {
namespace {

constexpr size_t roundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }
constexpr size_t kHeaderBytes = roundUp(sizeof(InboxHeader), kPageBytes);
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// A failure to get memory for the inbox: says what to change.
Status capacityError(const char* what, int err, size_t bytes) {
  return systemError(
      std::string(what) + " for a " + std::to_string(bytes) +
      "-byte shared-memory inbox failed: " + errnoText(err) +
      ". This process may not use that much shared memory (container or cgroup memory limit): "
      "raise the limit (docker: --memory, and --shm-size where /dev/shm is small), lower "
      "LOOM_SHM_FIFO_BYTES, or set NCCL_SHM_DISABLE=1 to connect the ranks of this host over TCP");
}

std::string procPath(int32_t pid, int32_t fd) {
  return "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
}

// Opening a peer's fd failed: explains the usual causes.
Status openError(const char* what, const std::string& path, int err, int peerRank, int32_t pid) {
  std::string msg = "opening " + std::string(what) + " of rank " + std::to_string(peerRank) +
                    " (" + path + ") failed: " + errnoText(err);
  if (err == ENOENT || err == ESRCH) {
    msg += ". Process " + std::to_string(pid) +
           " is not visible here: it exited, or the ranks run in different PID namespaces "
           "(separate containers); run them in one PID namespace (docker --pid=host or one "
           "container) or set NCCL_SHM_DISABLE=1";
  } else if (err == EACCES || err == EPERM) {
    msg += ". The ranks run as different users or the peer is not dumpable; run them as the same "
           "user or set NCCL_SHM_DISABLE=1";
  } else {
    msg += "; set NCCL_SHM_DISABLE=1 to connect the ranks of this host over TCP";
  }
  return remoteError(std::move(msg));
}

Status notTheInbox(int peerRank, int32_t pid, const std::string& why) {
  return remoteError("the shared memory opened for rank " + std::to_string(peerRank) + " (pid " +
                     std::to_string(pid) + ") is not that rank's inbox: " + why +
                     ". The ranks likely run in different PID namespaces; run them in one or "
                     "set NCCL_SHM_DISABLE=1");
}

// Checks the header of a mapped peer inbox against its descriptor.
Status checkHeader(const InboxHeader& h, const ShmDescriptor& d, int peerRank) {
  if (h.magic != kInboxMagic || h.nonce != d.nonce) {
    return notTheInbox(peerRank, d.pid, "magic or nonce differ");
  }
  if (h.version != kLayoutVersion) {
    return remoteError("rank " + std::to_string(peerRank) + " uses shared-memory layout version " +
                       std::to_string(h.version) + ", this process " +
                       std::to_string(kLayoutVersion) + ": run the same loom build on all ranks");
  }
  const bool sane = h.slots == kSlots && h.slotBytes >= kMinSlotBytes &&
                    h.slotBytes <= kMaxSlotBytes && h.slotBytes % kPageBytes == 0 &&
                    h.dataOffset == kHeaderBytes &&
                    h.totalBytes == h.dataOffset + kSlots * h.slotBytes &&
                    h.totalBytes == d.inboxBytes && h.ownerPid == d.pid;
  if (!sane) return notTheInbox(peerRank, d.pid, "its header describes a different layout");
  return Status::ok();
}

}  // namespace

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    reset();
    addr_ = other.addr_;
    bytes_ = other.bytes_;
    other.addr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Mapping::reset() {
  if (addr_ != nullptr) ::munmap(addr_, bytes_);
  addr_ = nullptr;
  bytes_ = 0;
}

Result<Inbox> Inbox::create(size_t slotBytes, uint64_t nonce) {
  if (slotBytes < kMinSlotBytes || slotBytes > kMaxSlotBytes || slotBytes % kPageBytes != 0) {
    return invalidArgument("shared-memory slot size " + std::to_string(slotBytes) +
                           " must be a multiple of 4096 between 4096 and " +
                           std::to_string(kMaxSlotBytes));
  }
  const size_t total = kHeaderBytes + kSlots * slotBytes;
  Inbox in;
  in.memfd_.reset(::memfd_create("loom-shm-inbox", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!in.memfd_) {
    int err = errno;
    if (err == ENOSYS) {
      return systemError("memfd_create is not available (" + errnoText(err) +
                         "): the kernel is older than 3.17 or a seccomp filter blocks it; set "
                         "NCCL_SHM_DISABLE=1 to connect the ranks of this host over TCP");
    }
    return capacityError("memfd_create", err, total);
  }
  const int fd = in.memfd_.get();
  if (::ftruncate(fd, off_t(total)) != 0) return capacityError("ftruncate", errno, total);
  // Allocate every page now: a limit hit later would be a SIGBUS on first touch.
  bool populate = false;
  if (::fallocate(fd, 0, 0, off_t(total)) != 0) {
    int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) return capacityError("fallocate", err, total);
    populate = true;
  }
  if (::fcntl(fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) {
    return systemErrno("sealing the shared-memory inbox (fcntl F_ADD_SEALS)", errno);
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) return capacityError("mmap", errno, total);
  in.map_ = Mapping(p, total);

  int pipeFds[2];
  if (::pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return systemErrno("creating the shared-memory wake pipe", errno);
  }
  in.wakeRead_.reset(pipeFds[0]);
  in.wakeWrite_.reset(pipeFds[1]);
  struct stat st {};
  if (::fstat(pipeFds[0], &st) != 0) return systemErrno("fstat of the wake pipe", errno);

  // Fresh memfd pages are zero: the atomics start at 0 (closed, head, tail...).
  auto* h = new (p) InboxHeader();
  h->magic = kInboxMagic;
  h->nonce = nonce;
  h->version = kLayoutVersion;
  h->slots = kSlots;
  h->slotBytes = slotBytes;
  h->totalBytes = total;
  h->dataOffset = kHeaderBytes;
  h->ownerAddr = reinterpret_cast<uintptr_t>(p);
  h->wakeIno = uint64_t(st.st_ino);
  h->ownerPid = int32_t(::getpid());
  std::atomic_thread_fence(std::memory_order_release);
  in.slotBytes_ = slotBytes;
  in.dataOffset_ = kHeaderBytes;
  in.nonce_ = nonce;
  in.ownerPid_ = h->ownerPid;
  return in;
}

ShmDescriptor Inbox::describe() const {
  ShmDescriptor d;
  d.magic = kDescriptorMagic;
  d.nonce = nonce_;
  d.inboxBytes = totalBytes();
  d.pid = ownerPid_;
  d.memfd = memfd_.get();
  d.wakeFd = wakeRead_.get();
  d.version = kLayoutVersion;
  return d;
}

Result<Inbox> Inbox::open(const ShmDescriptor& d, int peerRank) {
  const std::string who = "rank " + std::to_string(peerRank);
  if (d.magic != kDescriptorMagic || d.version != kLayoutVersion) {
    return remoteError(who + " sent a shared-memory descriptor this build does not understand "
                       "(magic or version differ): run the same loom build on all ranks");
  }
  if (d.pid <= 0 || d.memfd < 0 || d.wakeFd < 0 || d.inboxBytes <= kHeaderBytes ||
      d.inboxBytes > kHeaderBytes + kSlots * kMaxSlotBytes) {
    return remoteError(who + " sent a malformed shared-memory descriptor");
  }
  Inbox in;
  const std::string memPath = procPath(d.pid, d.memfd);
  net::UniqueFd mem(::open(memPath.c_str(), O_RDWR | O_CLOEXEC));
  if (!mem) return openError("the shared-memory inbox", memPath, errno, peerRank, d.pid);
  struct stat st {};
  if (::fstat(mem.get(), &st) != 0) return systemErrno("fstat of " + memPath, errno);
  int seals = ::fcntl(mem.get(), F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || uint64_t(st.st_size) != d.inboxBytes || seals < 0 ||
      (unsigned(seals) & kSeals) != kSeals) {
    return notTheInbox(peerRank, d.pid, memPath + " is not a sealed memfd of the announced size");
  }
  void* p = ::mmap(nullptr, d.inboxBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   mem.get(), 0);
  if (p == MAP_FAILED) return capacityError("mmap of the peer's inbox", errno, d.inboxBytes);
  in.map_ = Mapping(p, d.inboxBytes);
  std::atomic_thread_fence(std::memory_order_acquire);
  // Checked on a private copy, which alone defines the layout from now on.
  InboxHeader copy;
  std::memcpy(static_cast<void*>(&copy), in.header(), offsetof(InboxHeader, closed));
  LOOM_TRY(checkHeader(copy, d, peerRank));
  in.slotBytes_ = size_t(copy.slotBytes);
  in.dataOffset_ = size_t(copy.dataOffset);
  in.nonce_ = copy.nonce;
  in.ownerPid_ = copy.ownerPid;
  const uint64_t wakeIno = copy.wakeIno;

  // O_RDWR: this process then also counts as a reader, so a write can never
  // raise SIGPIPE after the owner exits (a full pipe just says EAGAIN).
  const std::string wakePath = procPath(d.pid, d.wakeFd);
  in.wakeWrite_.reset(::open(wakePath.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!in.wakeWrite_) return openError("the wake pipe", wakePath, errno, peerRank, d.pid);
  if (::fstat(in.wakeWrite_.get(), &st) != 0) return systemErrno("fstat of " + wakePath, errno);
  if (!S_ISFIFO(st.st_mode) || uint64_t(st.st_ino) != wakeIno) {
    return notTheInbox(peerRank, d.pid, wakePath + " is not the announced wake pipe");
  }
  return in;
}

void Inbox::drainWakeups() const {
  char buf[64];
  while (::read(wakeRead_.get(), buf, sizeof buf) == ssize_t(sizeof buf)) {
  }
}

void Inbox::signal() const {
  const char byte = 1;
  ssize_t n;
  do {
    n = ::write(wakeWrite_.get(), &byte, 1);
  } while (n < 0 && errno == EINTR);
}

}  // namespace loom::transport::shm
