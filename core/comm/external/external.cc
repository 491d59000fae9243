#include "core/comm/external/external.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/comm/collective_call.h"
#include "core/comm/layered_communicator.h"

namespace distckpt {
namespace internal_external {
namespace {

using internal_comm::Call;
using internal_comm::Clock;
using internal_comm::Millis;

class ExternalCommunicator final : public internal_comm::LayeredCommunicator {
 public:
  explicit ExternalCommunicator(const ExternalCallbacks& cb)
      : LayeredCommunicator("external", cb.rank, cb.size), cb_(cb) {}

 private:
  Status RawAllGather(const Call& call, const void* send, size_t n, void* recv, const std::string& what) override {
    return Invoke(call, "allgather", what,
                  [&](uint64_t ms) { return cb_.allgather(send, n, recv, ms, cb_.user_data); });
  }

  Status RawBroadcast(const Call& call, void* buf, size_t n, const std::string& what) override {
    return Invoke(call, "broadcast", what,
                  [&](uint64_t ms) { return cb_.broadcast(buf, n, call.root, ms, cb_.user_data); });
  }

  Status RawBarrier(const Call& call) override {
    if (cb_.barrier == nullptr) return LayeredCommunicator::RawBarrier(call);
    return Invoke(call, "barrier", "", [&](uint64_t ms) { return cb_.barrier(ms, cb_.user_data); });
  }

  // Runs one callback with what is left of the call's timeout (at least 1 ms: 0 often means "no limit").
  template <typename F>
  Status Invoke(const Call& call, const char* callback, const std::string& what, F&& f) {
    const std::string during = " on " + Who() + " during " + call.Describe() + (what.empty() ? "" : " (" + what + ")") +
                               "; timeout " + std::to_string(call.timeout.count()) + " ms";
    const auto left = std::chrono::duration_cast<Millis>(call.deadline - Clock::now());
    if (left.count() <= 0 && call.timeout.count() > 0) {
      return TimeoutError(std::string("external: out of time before the ") + callback + " callback" + during);
    }
    const uint64_t ms = static_cast<uint64_t>(std::max<int64_t>(1, left.count()));
    int rc = 0;
    try {
      rc = f(ms);
    } catch (...) {
      // A C++ host may throw through the callback; nothing may escape the communicator.
      return Status(StatusCode::kUser, std::string("external ") + callback + " callback threw an exception" + during);
    }
    if (rc != 0) {
      return Status(StatusCode::kUser,
                    std::string("external ") + callback + " callback returned " + std::to_string(rc) + during);
    }
    return OkStatus();
  }

  const ExternalCallbacks cb_;
};

}  // namespace
}  // namespace internal_external

Result<std::unique_ptr<Communicator>> NewExternalCommunicator(const ExternalCallbacks& callbacks) {
  if (callbacks.size < 1) {
    return InvalidArgument("external: size " + std::to_string(callbacks.size) + " is not positive");
  }
  if (callbacks.rank < 0 || callbacks.rank >= callbacks.size) {
    return InvalidArgument("external: rank " + std::to_string(callbacks.rank) + " is not in [0, " +
                           std::to_string(callbacks.size) + ")");
  }
  if (callbacks.allgather == nullptr) return InvalidArgument("external: the allgather callback is required (NULL)");
  if (callbacks.broadcast == nullptr) return InvalidArgument("external: the broadcast callback is required (NULL)");
  return std::unique_ptr<Communicator>(new internal_external::ExternalCommunicator(callbacks));
}

}  // namespace distckpt
