// A growable FIFO ring used for the transports' queues: push at the back, pop
// at the front, index from the front. Capacity doubles when full and never
// shrinks, so a connection in steady state queues without allocating.
// T must be default-constructible and movable. Not thread-safe.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace loom::transport {

template <typename T>
class Ring {
 public:
  explicit Ring(size_t initialCapacity = 16) {
    size_t cap = 1;
    while (cap < initialCapacity) cap <<= 1;
    slots_.resize(cap);
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }
  T& back() { return (*this)[size_ - 1]; }
  // i-th element from the front; i < size().
  T& operator[](size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) & (slots_.size() - 1)]; }

  void push(T value) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(value);
    ++size_;
  }
  void pop() {
    slots_[head_] = T();
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }
  void clear() {
    while (!empty()) pop();
  }

 private:
  void grow() {
    std::vector<T> bigger(slots_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;  // size is a power of two
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace loom::transport
