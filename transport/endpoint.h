// Endpoints: a backend's connection data as it travels between ranks (and
// core's other versioned blobs, such as the per-rank info of the init
// exchange). A blob starts with its format version (a u32) followed by its
// fields, written and read in the same order: little-endian fixed-size
// integers, raw byte arrays of a fixed size, and strings (a u32 length, then
// the bytes). Readers never trust the blob: every read is bounds-checked,
// and a short, long or unknown-version blob is an error.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace loom::transport {

class EndpointWriter {
 public:
  EndpointWriter(std::vector<uint8_t>* out, uint32_t version) : out_(out) {
    out_->clear();
    put(version);
  }
  template <typename T>
  void put(T value) {
    static_assert(std::is_integral_v<T>, "endpoint fields are fixed-size integers");
    for (size_t i = 0; i < sizeof(T); ++i) out_->push_back(uint8_t(uint64_t(value) >> (8 * i)));
  }
  void putBytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void putString(std::string_view text) {
    put(uint32_t(text.size()));
    putBytes(text.data(), text.size());
  }

 private:
  std::vector<uint8_t>* out_;
};

class EndpointReader {
 public:
  // `what` names the endpoint in errors ("shared-memory endpoint").
  EndpointReader(std::span<const uint8_t> blob, const char* what) : blob_(blob), what_(what) {}

  // The version, checked against the one this build writes.
  Status expectVersion(uint32_t version) {
    uint32_t v = 0;
    if (!get(&v)) return truncated();
    if (v != version) {
      return remoteError(std::string("the peer sent a ") + what_ + " of version " + std::to_string(v) +
                         ", this build reads version " + std::to_string(version) +
                         " (different loom versions?)");
    }
    return Status::ok();
  }
  template <typename T>
  bool get(T* value) {
    static_assert(std::is_integral_v<T>, "endpoint fields are fixed-size integers");
    if (blob_.size() - at_ < sizeof(T)) {
      short_ = true;
      return false;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(blob_[at_ + i]) << (8 * i);
    at_ += sizeof(T);
    *value = T(v);
    return true;
  }
  bool getBytes(void* p, size_t n) {
    if (blob_.size() - at_ < n) {
      short_ = true;
      return false;
    }
    if (n) std::memcpy(p, blob_.data() + at_, n);
    at_ += n;
    return true;
  }
  // A string of at most maxBytes (a longer one is an error at finish()).
  bool getString(std::string* text, size_t maxBytes) {
    uint32_t n = 0;
    if (!get(&n)) return false;
    if (n > maxBytes) {
      tooLong_ = true;
      return false;
    }
    text->resize(n);
    return getBytes(text->data(), n);
  }
  // After the last field: an error when a read ran short or bytes are left.
  Status finish() const {
    if (tooLong_) return remoteError(std::string("the peer sent a ") + what_ + " with an oversized string");
    if (short_) return truncated();
    if (at_ != blob_.size()) {
      return remoteError(std::string("the peer sent a ") + what_ + " with " + std::to_string(blob_.size() - at_) +
                         " unexpected trailing bytes");
    }
    return Status::ok();
  }

 private:
  Status truncated() const {
    return remoteError(std::string("the peer sent a truncated ") + what_ + " (" + std::to_string(blob_.size()) +
                       " bytes)");
  }
  std::span<const uint8_t> blob_;
  const char* what_;
  size_t at_ = 0;
  bool short_ = false;
  bool tooLong_ = false;
};

}  // namespace loom::transport
