// The Gloo plugin's side of plugin_abi.h: the Gloo communicator (gloo.cc) behind the C table that libdistckpt_gloo.so
// exports. Every entry point catches everything; results go into the host's buffers (plugin_abi.h says how).
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/base/version.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/plugin_abi.h"

struct dckpt_gloo_plugin_comm {
  std::unique_ptr<distckpt::Communicator> comm;
  // What SendRecv receives from each peer before it is copied to the host: kept across calls, so that the exchanges
  // of a load or a replication, which repeat with the same sizes, allocate nothing after the first.
  std::vector<std::string> received;
};

namespace distckpt {
namespace internal_gloo {
namespace {

using Millis = std::chrono::milliseconds;

// Copies `bytes` into the host's buffer; false if the host is out of memory.
bool Put(dckpt_gloo_plugin_bytes* into, std::string_view bytes) {
  char* p = into->resize(into->buf, bytes.size());
  if (p == nullptr) return false;
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  return true;
}

// The status code crossing the table; the message into the host's buffer (dropped if the host cannot take it).
int Report(const Status& st, dckpt_gloo_plugin_bytes* message) {
  if (!st.ok()) Put(message, st.message());
  return static_cast<int>(st.code());
}

Status OutOfHostMemory(const char* what) {
  return Status(StatusCode::kNoMemory, std::string("gloo: out of memory for the ") + what);
}

// Runs `body` (returning a Status) so that nothing escapes into the host.
template <typename Body>
int Guard(dckpt_gloo_plugin_bytes* message, Body&& body) {
  try {
    return Report(body(), message);
  } catch (const std::bad_alloc&) {
    return Report(Status(StatusCode::kNoMemory, "gloo: out of memory"), message);
  } catch (const std::exception& e) {
    return Report(Internal(std::string("gloo plugin: ") + e.what()), message);
  } catch (...) {
    return Report(Internal("gloo plugin: unknown exception"), message);
  }
}

Status PutAll(const std::vector<std::string>& parts, dckpt_gloo_plugin_bytes* all) {
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!Put(&all[r], parts[r])) return OutOfHostMemory("gathered contributions");
  }
  return OkStatus();
}

int Create(dckpt_gloo_plugin_comm** out, const dckpt_gloo_plugin_options* o, dckpt_gloo_plugin_bytes* message) {
  *out = nullptr;
  return Guard(message, [&]() -> Status {
    GlooOptions options;
    options.rank = o->rank;
    options.world_size = o->world_size;
    options.rendezvous = o->rendezvous;
    options.prefix = o->prefix;
    options.iface = o->iface;
    options.hostname = o->hostname;
    options.timeout = Millis(o->timeout_ms);
    DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, NewGlooCommunicator(options));
    auto* c = new dckpt_gloo_plugin_comm();
    c->comm = std::move(comm);
    c->received.resize(static_cast<size_t>(c->comm->size()));
    *out = c;
    return OkStatus();
  });
}

void Destroy(dckpt_gloo_plugin_comm* c) {
  try {
    delete c;
  } catch (...) {  // A destructor that throws would end the process; nothing is left to report to.
  }
}

int Rank(const dckpt_gloo_plugin_comm* c) { return c->comm->rank(); }
int Size(const dckpt_gloo_plugin_comm* c) { return c->comm->size(); }

int AllGather(dckpt_gloo_plugin_comm* c, const char* mine, size_t mine_size, dckpt_gloo_plugin_bytes* all,
              int64_t timeout_ms, dckpt_gloo_plugin_bytes* message) {
  return Guard(message, [&]() -> Status {
    std::vector<std::string> parts;
    DCKPT_RETURN_IF_ERROR(c->comm->AllGather(std::string(mine, mine_size), &parts, Millis(timeout_ms)));
    return PutAll(parts, all);
  });
}

int Gather(dckpt_gloo_plugin_comm* c, const char* mine, size_t mine_size, int root, dckpt_gloo_plugin_bytes* all,
           int64_t timeout_ms, dckpt_gloo_plugin_bytes* message) {
  return Guard(message, [&]() -> Status {
    std::vector<std::string> parts;
    DCKPT_RETURN_IF_ERROR(c->comm->Gather(std::string(mine, mine_size), root, &parts, Millis(timeout_ms)));
    return PutAll(parts, all);  // Empty except on the root.
  });
}

int Broadcast(dckpt_gloo_plugin_comm* c, const char* data, size_t size, int root, dckpt_gloo_plugin_bytes* out,
              int64_t timeout_ms, dckpt_gloo_plugin_bytes* message) {
  return Guard(message, [&]() -> Status {
    std::string bytes(data, size);  // Read before `out`, which may be the same buffer, is written.
    DCKPT_RETURN_IF_ERROR(c->comm->Broadcast(&bytes, root, Millis(timeout_ms)));
    if (c->comm->rank() != root && !Put(out, bytes)) return OutOfHostMemory("broadcast data");
    return OkStatus();
  });
}

int Barrier(dckpt_gloo_plugin_comm* c, int64_t timeout_ms, dckpt_gloo_plugin_bytes* message) {
  return Guard(message, [&] { return c->comm->Barrier(Millis(timeout_ms)); });
}

// The host's messages as the communicator takes them.
std::vector<std::pair<int, std::string_view>> Messages(const dckpt_gloo_plugin_send* sends, size_t n_sends) {
  std::vector<std::pair<int, std::string_view>> s;
  s.reserve(n_sends);
  for (size_t i = 0; i < n_sends; ++i) s.emplace_back(sends[i].peer, std::string_view(sends[i].data, sends[i].size));
  return s;
}

int SendRecv(dckpt_gloo_plugin_comm* c, const dckpt_gloo_plugin_send* sends, size_t n_sends,
             const dckpt_gloo_plugin_recv* recvs, size_t n_recvs, int64_t timeout_ms,
             dckpt_gloo_plugin_bytes* message) {
  return Guard(message, [&]() -> Status {
    const std::vector<std::pair<int, std::string_view>> s = Messages(sends, n_sends);
    // A peer out of range gets a buffer of its own: the communicator refuses the call, naming it.
    std::vector<std::string> stray;
    stray.reserve(n_recvs);
    std::vector<std::pair<int, std::string*>> r;
    r.reserve(n_recvs);
    for (size_t i = 0; i < n_recvs; ++i) {
      const int peer = recvs[i].peer;
      const bool known = peer >= 0 && static_cast<size_t>(peer) < c->received.size();
      r.emplace_back(peer, known ? &c->received[peer] : &stray.emplace_back());
    }
    DCKPT_RETURN_IF_ERROR(c->comm->SendRecv(s, r, Millis(timeout_ms)));
    for (size_t i = 0; i < n_recvs; ++i) {
      dckpt_gloo_plugin_bytes into = recvs[i].into;
      if (!Put(&into, *r[i].second)) return OutOfHostMemory("received messages");
    }
    return OkStatus();
  });
}

int SendRecvInto(dckpt_gloo_plugin_comm* c, const dckpt_gloo_plugin_send* sends, size_t n_sends,
                 const dckpt_gloo_plugin_recv_into* recvs, size_t n_recvs, int64_t timeout_ms,
                 dckpt_gloo_plugin_bytes* message) {
  return Guard(message, [&]() -> Status {
    std::vector<Communicator::RecvInto> r;
    r.reserve(n_recvs);
    for (size_t i = 0; i < n_recvs; ++i) r.push_back({recvs[i].peer, recvs[i].data, recvs[i].size});
    return c->comm->SendRecvInto(Messages(sends, n_sends), r, Millis(timeout_ms));
  });
}

void Abort(dckpt_gloo_plugin_comm* c, const char* reason) {
  try {
    c->comm->Abort(reason);
  } catch (...) {  // Abort is best effort: the communicator is unusable afterwards either way.
  }
}

constexpr dckpt_gloo_plugin_api kApi = {
    DCKPT_GLOO_PLUGIN_ABI,
    sizeof(dckpt_gloo_plugin_api),
    kVersionString,
    Create,
    Destroy,
    Rank,
    Size,
    AllGather,
    Gather,
    Broadcast,
    Barrier,
    SendRecv,
    Abort,
    SendRecvInto,
};

}  // namespace
}  // namespace internal_gloo
}  // namespace distckpt

extern "C" __attribute__((visibility("default"))) const dckpt_gloo_plugin_api* dckpt_gloo_plugin_entry(void) {
  return &distckpt::internal_gloo::kApi;
}
