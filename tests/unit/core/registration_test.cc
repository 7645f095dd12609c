// Tests of core/registration.h: user registrations shared by transfers,
// regions per connection created once, implicit registrations kept up to a
// budget (least recently used out), and nothing consulted for connections
// that need no registration.
#include "core/registration.h"

#include <gtest/gtest.h>

#include <vector>

namespace loom::core {
namespace {

using transport::MemoryType;
using transport::Region;
using transport::Transfer;

int gLiveRegions = 0;

// A region that counts itself, as a verbs memory region would hold the NIC.
class CountedRegion final : public Region {
 public:
  CountedRegion(void* base, size_t bytes, MemoryType memory) : Region(base, bytes, memory) { ++gLiveRegions; }
  ~CountedRegion() override { --gLiveRegions; }
};

// A connection whose backend registers memory (or not): only the
// registration side is exercised.
class RegisteringConnection final : public transport::Connection {
 public:
  explicit RegisteringConnection(bool needs) : needs_(needs) {}
  int peer() const override { return 1; }
  const char* kind() const override { return "test"; }
  bool moves(MemoryType m) const override { return m == MemoryType::kHost; }
  bool needsRegistration() const override { return needs_; }
  Result<std::unique_ptr<Region>> registerMemory(void* base, size_t bytes, MemoryType memory) override {
    ++calls;
    if (fail) return systemError("test: registration refused");
    return std::unique_ptr<Region>(new CountedRegion(base, bytes, memory));
  }
  Status progress() override { return Status::ok(); }
  void pollFds(std::vector<pollfd>*) const override {}
  bool idle() const override { return true; }
  int calls = 0;
  bool fail = false;

 protected:
  Status queueSend(Transfer*) override { return Status::ok(); }
  Status queueRecv(Transfer*) override { return Status::ok(); }

 private:
  bool needs_;
};

TEST(RegistrationCache, UserRegistrationServesEveryTransferInsideIt) {
  gLiveRegions = 0;
  RegistrationCache cache(1 << 20);
  std::vector<uint8_t> buf(4096);
  RegisteringConnection a(false), b(false);
  // Nothing registered, no backend needs it: nothing consulted.
  auto none = cache.find(a, buf.data(), 64, MemoryType::kHost);
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(none.value(), nullptr);
  EXPECT_EQ(a.calls, 0);

  const uint64_t h = cache.add(buf.data(), buf.size(), MemoryType::kHost);
  auto r1 = cache.find(a, buf.data() + 100, 200, MemoryType::kHost);
  auto r2 = cache.find(a, buf.data(), buf.size(), MemoryType::kHost);
  auto r3 = cache.find(b, buf.data() + 8, 8, MemoryType::kHost);
  ASSERT_TRUE(r1.isOk() && r2.isOk() && r3.isOk());
  ASSERT_NE(r1.value(), nullptr);
  EXPECT_EQ(r1.value(), r2.value()) << "one region per connection and registration";
  EXPECT_NE(r1.value(), r3.value());
  EXPECT_EQ(r1.value()->base(), buf.data());
  EXPECT_EQ(r1.value()->bytes(), buf.size());
  EXPECT_EQ(a.calls, 1);
  EXPECT_EQ(b.calls, 1);
  EXPECT_EQ(gLiveRegions, 2);
  // Outside the registration, or another memory type: none.
  auto outside = cache.find(a, buf.data() + 4000, 200, MemoryType::kHost);
  ASSERT_TRUE(outside.isOk());
  EXPECT_EQ(outside.value(), nullptr);
  auto pinned = cache.find(a, buf.data(), 8, MemoryType::kHostPinned);
  ASSERT_TRUE(pinned.isOk());
  EXPECT_EQ(pinned.value(), nullptr);
  EXPECT_EQ(cache.stats().regions, 2u);

  // A connection going away releases its regions only.
  cache.drop(&b);
  EXPECT_EQ(gLiveRegions, 1);
  // Deregistering releases the rest; a second time is an error.
  ASSERT_TRUE(cache.remove(h).isOk());
  EXPECT_EQ(gLiveRegions, 0);
  EXPECT_EQ(cache.remove(h).code(), Code::kInvalidArgument);
  auto after = cache.find(a, buf.data(), 8, MemoryType::kHost);
  ASSERT_TRUE(after.isOk());
  EXPECT_EQ(after.value(), nullptr);
}

// A window (ncclCommWindowRegister) serves transfers as a buffer
// registration does, and each kind is removed only as itself.
TEST(RegistrationCache, WindowsServeTransfersAndAreRemovedOnlyAsWindows) {
  gLiveRegions = 0;
  RegistrationCache cache(1 << 20);
  std::vector<uint8_t> buf(4096);
  RegisteringConnection a(false);
  const uint64_t w = cache.add(buf.data(), buf.size(), MemoryType::kHost, RegistrationCache::Kind::kWindow);
  const uint64_t h = cache.add(buf.data(), 64, MemoryType::kHost);
  auto r = cache.find(a, buf.data() + 1000, 100, MemoryType::kHost);
  ASSERT_TRUE(r.isOk());
  ASSERT_NE(r.value(), nullptr);
  EXPECT_EQ(r.value()->bytes(), buf.size());
  Status asBuffer = cache.remove(w);
  EXPECT_EQ(asBuffer.code(), Code::kInvalidArgument);
  EXPECT_NE(asBuffer.message().find("ncclCommWindowDeregister"), std::string::npos) << asBuffer.message();
  Status asWindow = cache.remove(h, RegistrationCache::Kind::kWindow);
  EXPECT_EQ(asWindow.code(), Code::kInvalidArgument);
  EXPECT_NE(asWindow.message().find("ncclCommDeregister"), std::string::npos) << asWindow.message();
  EXPECT_EQ(gLiveRegions, 1);
  ASSERT_TRUE(cache.remove(w, RegistrationCache::Kind::kWindow).isOk());
  EXPECT_EQ(gLiveRegions, 0);
  ASSERT_TRUE(cache.remove(h).isOk());
}

TEST(RegistrationCache, ImplicitRegistrationsAreReusedAndEvictedLeastRecentlyUsedFirst) {
  gLiveRegions = 0;
  RegistrationCache cache(3 * 1024);  // room for three 1 KiB buffers
  std::vector<uint8_t> mem(8 * 1024);
  RegisteringConnection c(true);
  auto at = [&](int i) { return mem.data() + size_t(i) * 1024; };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.find(c, at(i), 1024, MemoryType::kHost).isOk());
  EXPECT_EQ(c.calls, 3);
  // Reuse, also of a part: no new registration; buffer 0 becomes the most
  // recently used.
  auto again = cache.find(c, at(0) + 10, 100, MemoryType::kHost);
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again.value()->base(), at(0));
  EXPECT_EQ(c.calls, 3);
  // A fourth buffer evicts the least recently used one (1), not 0.
  ASSERT_TRUE(cache.find(c, at(3), 1024, MemoryType::kHost).isOk());
  EXPECT_EQ(c.calls, 4);
  EXPECT_EQ(gLiveRegions, 3);
  EXPECT_EQ(cache.stats().evicted, 1u);
  EXPECT_EQ(cache.stats().implicitBytes, 3u * 1024);
  ASSERT_TRUE(cache.find(c, at(0), 1024, MemoryType::kHost).isOk());
  EXPECT_EQ(c.calls, 4) << "buffer 0 survived the eviction";
  ASSERT_TRUE(cache.find(c, at(1), 1024, MemoryType::kHost).isOk());
  EXPECT_EQ(c.calls, 5) << "buffer 1 was evicted and registers again";
  // A registration the backend refuses is the transfer's error.
  c.fail = true;
  auto refused = cache.find(c, at(6), 1024, MemoryType::kHost);
  EXPECT_EQ(refused.status().code(), Code::kSystemError);
  cache.drop(&c);
  EXPECT_EQ(gLiveRegions, 0);
  EXPECT_EQ(cache.stats().implicitBytes, 0u);
}

// A user registration is preferred over an implicit one and registered
// once per connection even when the backend registers everything.
TEST(RegistrationCache, UserRegistrationWinsOverImplicit) {
  gLiveRegions = 0;
  RegistrationCache cache(1 << 20);
  std::vector<uint8_t> buf(4096);
  RegisteringConnection c(true);
  const uint64_t h = cache.add(buf.data(), buf.size(), MemoryType::kHost);
  auto r = cache.find(c, buf.data() + 512, 512, MemoryType::kHost);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r.value()->bytes(), buf.size());
  EXPECT_EQ(cache.stats().implicitBytes, 0u);
  ASSERT_TRUE(cache.remove(h).isOk());
  EXPECT_EQ(gLiveRegions, 0);
}

}  // namespace
}  // namespace loom::core
