// Status and Result<T>: errors are values inside the core; nothing throws across module boundaries.
#ifndef DISTCKPT_CORE_BASE_STATUS_H_
#define DISTCKPT_CORE_BASE_STATUS_H_

#include <cassert>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

namespace distckpt {

/// Status codes. The numeric values are the C ABI's DCKPT_E* codes and are never renumbered.
enum class StatusCode : int {
  kOk = 0,
  kUnknown = -1,           ///< An error that fits no other code.
  kInvalidArgument = -2,   ///< The caller passed something wrong.
  kNotFound = -3,          ///< A checkpoint, entry or file does not exist.
  kCorrupt = -4,           ///< Checksum mismatch, bad metadata, truncated file.
  kVersion = -5,           ///< Unsupported format major version or ABI version.
  kIo = -6,                ///< The operating system reported an I/O error.
  kTimeout = -7,           ///< A collective or wait ran past its deadline.
  kUser = -8,              ///< A user callback returned non-zero and aborted the operation.
  kNoMemory = -9,          ///< An allocation failed.
  kUnsupported = -10,      ///< Valid request that this build or backend cannot do.
  kExists = -11,           ///< The target already exists.
  kBufferTooSmall = -12,   ///< The caller's buffer is too small; the needed size is reported.
  kPeer = -13,             ///< Another rank failed; this rank aborted with it.
  kNoSpace = -14,          ///< The disk or quota is full.
  kState = -15,            ///< The object is in the wrong state for this call (e.g. already freed/used).
  kInternal = -16,         ///< A bug in distckpt. Please report it.
};

/// Returns a short stable name such as "corrupt" for a code.
const char* StatusCodeName(StatusCode code);

/// An error code plus a human readable message. Cheap to move; OK carries no allocation.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  /// Returns a copy whose message is prefixed with `context: `.
  Status WithContext(const std::string& context) const;
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgument(std::string msg);
Status NotFound(std::string msg);
Status Corrupt(std::string msg);
Status VersionError(std::string msg);
Status IoError(std::string msg);
/// An I/O error from `errno`: picks kNoSpace/kNotFound/kIo by errno and appends strerror.
Status ErrnoError(int err, std::string msg);
Status TimeoutError(std::string msg);
Status Unsupported(std::string msg);
Status Internal(std::string msg);

/// Either a value or an error Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : status_(), has_value_(true) { new (&storage_) T(std::move(value)); }  // NOLINT
  Result(Status status) : status_(std::move(status)), has_value_(false) {                 // NOLINT
    assert(!status_.ok() && "Result constructed from an OK status without a value");
    if (status_.ok()) status_ = Internal("Result constructed from OK status without a value");
  }
  Result(const Result& other) : status_(other.status_), has_value_(other.has_value_) {
    if (has_value_) new (&storage_) T(other.value());
  }
  Result(Result&& other) noexcept : status_(std::move(other.status_)), has_value_(other.has_value_) {
    if (has_value_) new (&storage_) T(std::move(other.value()));
  }
  Result& operator=(Result other) {
    Reset();
    status_ = std::move(other.status_);
    has_value_ = other.has_value_;
    if (has_value_) new (&storage_) T(std::move(other.value()));
    return *this;
  }
  ~Result() { Reset(); }

  bool ok() const { return has_value_; }
  const Status& status() const { return status_; }
  T& value() & {
    assert(has_value_);
    return *reinterpret_cast<T*>(&storage_);
  }
  const T& value() const& {
    assert(has_value_);
    return *reinterpret_cast<const T*>(&storage_);
  }
  T&& value() && {
    assert(has_value_);
    return std::move(*reinterpret_cast<T*>(&storage_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void Reset() {
    if (has_value_) reinterpret_cast<T*>(&storage_)->~T();
    has_value_ = false;
  }
  Status status_;
  bool has_value_;
  typename std::aligned_storage<sizeof(T), alignof(T)>::type storage_;
};

}  // namespace distckpt

#define DCKPT_CONCAT_INNER_(a, b) a##b
#define DCKPT_CONCAT_(a, b) DCKPT_CONCAT_INNER_(a, b)

/// Returns from the enclosing function if `expr` (a Status) is not OK.
#define DCKPT_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::distckpt::Status dckpt_status_ = (expr);      \
    if (!dckpt_status_.ok()) return dckpt_status_;  \
  } while (0)

#define DCKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

/// `DCKPT_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define DCKPT_ASSIGN_OR_RETURN(lhs, expr) \
  DCKPT_ASSIGN_OR_RETURN_IMPL_(DCKPT_CONCAT_(dckpt_result_, __LINE__), lhs, expr)

#endif  // DISTCKPT_CORE_BASE_STATUS_H_
