// Internal to the Gloo backend: how a rank joins its group. The stores behind the rendezvous URI (a shared directory
// or a Redis server; the URI itself is parsed in gloo_options.h, without Gloo), the exchange of pair addresses
// through the store, and the connected transport it yields; gloo.cc puts the communicator on top.
#ifndef DISTCKPT_CORE_COMM_GLOO_GLOO_RENDEZVOUS_H_
#define DISTCKPT_CORE_COMM_GLOO_GLOO_RENDEZVOUS_H_

#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/collective_call.h"
#include "core/comm/gloo/gloo_options.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"

namespace distckpt {
namespace internal_gloo {

/// One rank's transport once every pair is connected: the device (Gloo's event loop) and the context holding a
/// pair per peer.
struct ConnectedTransport {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::transport::Context> context;
};

class Store;
struct Published;

/// Forms one rank's connections through the store. Keep it alive until the group's first barrier has passed: its
/// destructor removes this rank's key, which every peer must have read by then. Gloo's exceptions other than
/// std::bad_alloc are turned into Status; std::bad_alloc propagates.
class Rendezvous {
 public:
  /// `o` must outlive this object; everything, connecting included, ends by `deadline`.
  Rendezvous(const GlooOptions& o, internal_comm::Clock::time_point deadline);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  /// Publishes this rank's pair addresses, waits for every peer's, and connects a pair to each.
  Result<ConnectedTransport> Connect(const Target& target);

  /// "<rendezvous> (prefix '<prefix>')", for messages.
  const std::string& where() const { return where_; }

 private:
  std::string Key(int rank) const;
  Status OpenStore(const Target& target);
  Status CreateDevice(std::shared_ptr<gloo::transport::Device>* device);
  Status Publish(const std::string& blob);
  Status AwaitAndFetch(std::vector<Published>* peers);
  Status MissingRanks(int first);
  void RemoveOwnKey();

  const GlooOptions& o_;
  const internal_comm::Clock::time_point deadline_;
  std::string where_;
  std::string who_;
  std::unique_ptr<Store> store_;
  bool published_ = false;
};

}  // namespace internal_gloo
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_RENDEZVOUS_H_
