// A minimal non-owning view of a contiguous array (C++17 has no std::span).
#ifndef DISTCKPT_CORE_BASE_SPAN_H_
#define DISTCKPT_CORE_BASE_SPAN_H_

#include <cstddef>
#include <vector>

namespace distckpt {

template <typename T>
class Span {
 public:
  constexpr Span() = default;
  constexpr Span(T* data, size_t size) : data_(data), size_(size) {}
  template <typename U>
  Span(const std::vector<U>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT
  template <typename U>
  Span(std::vector<U>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T& operator[](size_t i) const { return data_[i]; }
  constexpr T* begin() const { return data_; }
  constexpr T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_SPAN_H_
