#include "core/base/status.h"

#include <cerrno>
#include <cstring>

namespace distckpt {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kUnknown: return "unknown";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kVersion: return "unsupported version";
    case StatusCode::kIo: return "I/O error";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kUser: return "aborted by callback";
    case StatusCode::kNoMemory: return "out of memory";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kExists: return "already exists";
    case StatusCode::kBufferTooSmall: return "buffer too small";
    case StatusCode::kPeer: return "peer rank failed";
    case StatusCode::kNoSpace: return "no space left";
    case StatusCode::kState: return "bad state";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status InvalidArgument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
Status Corrupt(std::string msg) { return Status(StatusCode::kCorrupt, std::move(msg)); }
Status VersionError(std::string msg) { return Status(StatusCode::kVersion, std::move(msg)); }
Status IoError(std::string msg) { return Status(StatusCode::kIo, std::move(msg)); }
Status TimeoutError(std::string msg) { return Status(StatusCode::kTimeout, std::move(msg)); }
Status Unsupported(std::string msg) { return Status(StatusCode::kUnsupported, std::move(msg)); }
Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }

Status ErrnoError(int err, std::string msg) {
  StatusCode code = StatusCode::kIo;
  if (err == ENOSPC || err == EDQUOT) code = StatusCode::kNoSpace;
  if (err == ENOENT) code = StatusCode::kNotFound;
  if (err == EEXIST || err == ENOTEMPTY) code = StatusCode::kExists;
  if (err == ENOMEM) code = StatusCode::kNoMemory;
  return Status(code, msg + ": " + std::strerror(err));
}

}  // namespace distckpt
