// Internal to the extension module: the communicator bound as distckpt._distckpt.Comm (Gloo, or collectives
// supplied by Python callables); save, load and the reader take one.
#ifndef DISTCKPT_BINDINGS_COMM_H_
#define DISTCKPT_BINDINGS_COMM_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings/binding_util.h"

namespace distckpt_python {

/// A communicator: Gloo, or collectives supplied by Python callables (torch.distributed, mpi4py, ...).
class Comm {
 public:
  static std::shared_ptr<Comm> Gloo(int rank, int world_size, std::optional<std::string> rendezvous,
                                    std::optional<std::string> prefix, std::optional<std::string> iface,
                                    std::optional<std::string> hostname, uint64_t timeout_ms);

  static std::shared_ptr<Comm> External(int rank, int size, py::object allgather, py::object broadcast,
                                        py::object barrier);

  ~Comm();

  dckpt_comm* get();
  int rank();
  int size();
  void Barrier(uint64_t timeout_ms);
  void Abort(const std::string& reason);
  void Close();
  bool closed() const { return comm_ == nullptr; }
  CallbackErrors* errors() { return &errors_; }

  /// Marks the communicator busy for the lifetime of a collective call or an async save.
  class Use {
   public:
    explicit Use(std::shared_ptr<Comm> c) : comm_(std::move(c)) {
      if (comm_) ++comm_->users_;
    }
    ~Use() {
      if (comm_) --comm_->users_;
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    dckpt_comm* get() const { return comm_ ? comm_->get() : nullptr; }
    const std::shared_ptr<Comm>& comm() const { return comm_; }

   private:
    std::shared_ptr<Comm> comm_;
  };

 private:
  Comm() = default;

  // The memoryviews handed to Python point into distckpt's buffers: they are released when the callback returns,
  // so a callback that keeps one gets a released view rather than a dangling pointer.
  static void ReleaseView(py::object& view);

  static int AllgatherTrampoline(const void* send, size_t send_size, void* recv, uint64_t timeout_ms, void* user);

  static int BroadcastTrampoline(void* buf, size_t size, int root, uint64_t timeout_ms, void* user);

  static int BarrierTrampoline(uint64_t timeout_ms, void* user);

  int size_cached() const { return size_; }

  dckpt_comm* comm_ = nullptr;
  std::atomic<int> users_{0};
  int size_ = -1;
  py::object allgather_, broadcast_, barrier_;
  CallbackErrors errors_;
};

}  // namespace distckpt_python

#endif  // DISTCKPT_BINDINGS_COMM_H_
