#include "core/comm/communicator.h"

namespace distckpt {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }

  Status AllGather(const std::string& mine, std::vector<std::string>* all, std::chrono::milliseconds) override {
    all->assign(1, mine);
    return OkStatus();
  }
  Status Gather(const std::string& mine, int root, std::vector<std::string>* all, std::chrono::milliseconds) override {
    if (root != 0) return InvalidArgument("gather root " + std::to_string(root) + " is not a rank of a 1-rank group");
    all->assign(1, mine);
    return OkStatus();
  }
  Status Broadcast(std::string*, int root, std::chrono::milliseconds) override {
    if (root != 0) return InvalidArgument("broadcast root " + std::to_string(root) + " is not a rank of a 1-rank group");
    return OkStatus();
  }
  Status Barrier(std::chrono::milliseconds) override { return OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> NewSingleProcessCommunicator() { return std::make_unique<SingleProcessCommunicator>(); }

}  // namespace distckpt
