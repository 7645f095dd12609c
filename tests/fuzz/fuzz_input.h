// Helpers shared by the fuzz targets: reading a fuzzer's input as a stream of
// fields, and a check that stops the run (a crash libFuzzer keeps) when a
// library contract is broken.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace loom::fuzz {

// Reads fixed-size fields off the front of the input. Past the end every
// read yields zero bytes, so any input decodes to something.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t left() const { return size_ - pos_; }
  bool empty() const { return pos_ == size_; }

  // Copies `n` bytes into `out`, zero-filling what the input lacks.
  void bytes(void* out, size_t n) {
    size_t take = n < left() ? n : left();
    std::memcpy(out, data_ + pos_, take);
    std::memset(static_cast<uint8_t*>(out) + take, 0, n - take);
    pos_ += take;
  }
  template <typename T>
  T take() {
    T v;
    bytes(&v, sizeof v);
    return v;
  }
  uint8_t u8() { return take<uint8_t>(); }
  uint16_t u16() { return take<uint16_t>(); }
  uint32_t u32() { return take<uint32_t>(); }
  uint64_t u64() { return take<uint64_t>(); }
  // Up to `n` bytes in place (fewer at the end of the input).
  std::string_view view(size_t n) {
    size_t take = n < left() ? n : left();
    std::string_view v(reinterpret_cast<const char*>(data_ + pos_), take);
    pos_ += take;
    return v;
  }
  std::string_view rest() { return view(left()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace loom::fuzz

// What an input did, for reading a reproducer: compiled in only with
// -DLOOM_FUZZ_TRACE (README.md), since printing would slow fuzzing down.
#ifdef LOOM_FUZZ_TRACE
inline constexpr bool kFuzzTrace = true;
#else
inline constexpr bool kFuzzTrace = false;
#endif
#define FUZZ_TRACE(...)                                 \
  do {                                                  \
    if (kFuzzTrace) std::fprintf(stderr, __VA_ARGS__);  \
  } while (0)

// A broken contract of the code under test: print and abort, which libFuzzer
// records as a crash with its input.
#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
