// The communicator interface: byte-buffer collectives with a timeout on every call. Backends: single process,
// Gloo over TCP, external (host callbacks through the C ABI) and NCCL (loaded at run time). All backends pass the
// shared conformance suite.
#ifndef DISTCKPT_CORE_COMM_COMMUNICATOR_H_
#define DISTCKPT_CORE_COMM_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

/// Default collective timeout: generous, since a rank may be slow to reach a checkpoint.
constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{10 * 60 * 1000};

/// A group of ranks. Every rank must call the same collectives in the same order. A collective that does not
/// complete within `timeout` fails with kTimeout and a message naming the ranks that did not arrive (where the
/// backend can tell). After a failed collective the communicator may be unusable; callers abort the operation.
/// Not thread-safe: one collective at a time per communicator.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  ///< "single", "gloo", "external", "nccl"

  /// Every rank contributes `mine` (any size); every rank receives all contributions indexed by rank.
  virtual Status AllGather(const std::string& mine, std::vector<std::string>* all,
                           std::chrono::milliseconds timeout) = 0;
  /// Like AllGather but only `root` receives (`all` is left empty elsewhere).
  virtual Status Gather(const std::string& mine, int root, std::vector<std::string>* all,
                        std::chrono::milliseconds timeout) = 0;
  /// `root`'s *data is copied to every rank's *data.
  virtual Status Broadcast(std::string* data, int root, std::chrono::milliseconds timeout) = 0;
  virtual Status Barrier(std::chrono::milliseconds timeout) = 0;

  /// Point-to-point: sends the bytes sends[i].second (which must stay valid during the call) to rank sends[i].first,
  /// and receives into *recvs[j].second (its contents
  /// replaced, its capacity reused: a buffer kept across calls is not allocated again) what rank recvs[j].first sends
  /// to this rank. Every rank calls it, in the same order as the other collectives, with or without messages; a rank
  /// lists as recvs exactly the ranks that send to it, each at most once, never itself. Backends that can move bytes
  /// between two ranks directly (Gloo) do; the default moves them with one AllGather of who receives, then one Gather
  /// per receiving rank.
  virtual Status SendRecv(const std::vector<std::pair<int, std::string_view>>& sends,
                          const std::vector<std::pair<int, std::string*>>& recvs, std::chrono::milliseconds timeout);

  /// A receive of SendRecvInto: exactly `size` bytes from rank `peer`, written at `data`.
  struct RecvInto {
    int peer;
    char* data;
    size_t size;
  };
  /// As SendRecv, but each message is received into caller memory of the size the caller expects (a file's mapping,
  /// the place the bytes belong), so that bytes moved between ranks are not copied again on arrival. A message of
  /// another size is kInternal naming the peer and both sizes, and nothing is written past `size` (what was written
  /// before then is unspecified). Unlike SendRecv, a rank may send several messages to one peer in one call: the k-th
  /// send to a peer is the peer's k-th receive from this rank (so the peer lists as many receives from it, in order),
  /// and they are all in flight at once. Backends that move bytes between two ranks directly (Gloo) receive straight
  /// into `data`; the default receives through SendRecv (several messages to one peer framed as one) and copies.
  virtual Status SendRecvInto(const std::vector<std::pair<int, std::string_view>>& sends,
                              const std::vector<RecvInto>& recvs, std::chrono::milliseconds timeout);

  /// Tells the group this rank cannot take part any more (e.g. it failed before reaching a collective), so that
  /// ranks waiting on it fail promptly, naming it, instead of waiting out their timeouts. Backends that own their
  /// transport (Gloo) close it; others (single process, external: the host owns the transport) do nothing. The
  /// communicator is unusable afterwards.
  virtual void Abort(const std::string& reason) {}

  /// Whether this communicator may run collectives on a background thread while the application goes on with its own
  /// work on the same devices and its own communicators, as an asynchronous save does (SaveAsync refuses it
  /// otherwise, before anything is staged, with this status). OK by default: host transports of distckpt's own
  /// (single process, Gloo) run beside anything, and an external one is the host's to give (the Python client gives
  /// a torch process group's saves a gloo group of their own). A backend whose collectives are device work says why
  /// not and what to pass instead (NCCL: kUnsupported).
  virtual Status CheckBackgroundUse() const { return OkStatus(); }
};

/// OK when `got` bytes are what `recv` expects; otherwise SendRecvInto's kInternal naming the peer and both sizes.
Status CheckReceivedSize(const Communicator::RecvInto& recv, uint64_t got);

/// The trivial group of one rank.
std::unique_ptr<Communicator> NewSingleProcessCommunicator();

}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_COMMUNICATOR_H_
