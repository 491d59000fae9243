// How a rank joins its Gloo group: the stores, the exchange of pair addresses and connecting the pairs
// (gloo_rendezvous.h).
#include "core/comm/gloo/gloo_rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/wire.h"
#include "core/comm/gloo/gloo_util.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

namespace distckpt {
namespace internal_gloo {

// The store operations the rendezvous needs. Gloo's stores throw; callers convert.
class Store {
 public:
  virtual ~Store() = default;
  virtual void Set(const std::string& key, const std::string& value) = 0;
  virtual bool Has(const std::string& key) = 0;
  virtual std::string Get(const std::string& key) = 0;
  virtual void Remove(const std::string& key) = 0;
};

namespace {

class FileStore final : public Store, private gloo::rendezvous::FileStore {
 public:
  explicit FileStore(const std::string& dir) : gloo::rendezvous::FileStore(dir) {}
  void Set(const std::string& key, const std::string& value) override {
    set(key, std::vector<char>(value.begin(), value.end()));
  }
  bool Has(const std::string& key) override { return check({key}); }
  std::string Get(const std::string& key) override {
    std::vector<char> v = get(key);
    return std::string(v.begin(), v.end());
  }
  void Remove(const std::string& key) override { ::unlink(objectPath(key).c_str()); }
};

class RedisStore final : public Store, private gloo::rendezvous::RedisStore {
 public:
  RedisStore(const std::string& host, int port) : gloo::rendezvous::RedisStore(host, port) {}
  void Set(const std::string& key, const std::string& value) override {
    set(key, std::vector<char>(value.begin(), value.end()));
  }
  bool Has(const std::string& key) override { return check({key}); }
  std::string Get(const std::string& key) override {
    std::vector<char> v = get(key);
    return std::string(v.begin(), v.end());
  }
  void Remove(const std::string& key) override {
    void* reply = redisCommand(redis_, "DEL %b", key.data(), key.size());
    if (reply != nullptr) freeReplyObject(reply);
  }
};

Status MakeDirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "gloo: cannot create the rendezvous directory '" + partial + "'");
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument("gloo: rendezvous path '" + path + "' is not a directory");
  }
  return OkStatus();
}

// What a rank publishes: who it is (for error messages) and, for every peer, the address of its pair with that peer.
constexpr uint32_t kAddressMagic = 0x41474344;  // "DCGA"

}  // namespace

struct Published {
  int world_size = 0;
  int rank = -1;
  std::string host;
  uint64_t pid = 0;
  std::vector<std::string> addresses;  // Indexed by peer; empty for the publisher itself.

  std::string Describe() const { return "host " + host + ", pid " + std::to_string(pid); }
};

namespace {

std::string EncodePublished(const Published& p) {
  WireWriter w;
  w.U32(kAddressMagic);
  w.Var(1);  // Layout version.
  w.Var(static_cast<uint64_t>(p.world_size));
  w.Var(static_cast<uint64_t>(p.rank));
  w.Str(p.host);
  w.Var(p.pid);
  for (const std::string& a : p.addresses) w.Str(a);
  return w.Take();
}

bool DecodePublished(const std::string& bytes, Published* p) {
  WireReader r(bytes);
  uint32_t magic;
  uint64_t version, world, rank, pid;
  if (!r.U32(&magic) || magic != kAddressMagic || !r.Var(&version) || version != 1 || !r.Var(&world) || !r.Var(&rank) ||
      !r.Str(&p->host) || !r.Var(&pid) || world == 0 || world > (1u << 24) || rank >= world) {
    return false;
  }
  p->world_size = static_cast<int>(world);
  p->rank = static_cast<int>(rank);
  p->pid = pid;
  uint64_t entries = world;
  p->addresses.clear();
  for (uint64_t i = 0; i < entries; ++i) {
    std::string a;
    if (!r.Str(&a)) return false;
    p->addresses.push_back(std::move(a));
  }
  return r.done();
}

std::string LocalHostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

std::string AddressString(const std::string& bytes) {
  std::string s;
  std::string error;
  if (!CatchGloo([&] { s = gloo::transport::tcp::Address(std::vector<char>(bytes.begin(), bytes.end())).str(); },
                 &error)) {
    return "?";
  }
  return s;
}

}  // namespace

Rendezvous::Rendezvous(const GlooOptions& o, Clock::time_point deadline) : o_(o), deadline_(deadline) {
  where_ = o.rendezvous + (o.prefix.empty() ? "" : " (prefix '" + o.prefix + "')");
  who_ = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
}

Rendezvous::~Rendezvous() { RemoveOwnKey(); }

Result<ConnectedTransport> Rendezvous::Connect(const Target& target) {
  DCKPT_RETURN_IF_ERROR(OpenStore(target));
  std::shared_ptr<gloo::transport::Device> device;
  DCKPT_RETURN_IF_ERROR(CreateDevice(&device));

  // One pair (connection) per peer, each with its own address; the pairs are created before publishing.
  std::shared_ptr<gloo::transport::Context> context;
  Published mine;
  mine.world_size = o_.world_size;
  mine.rank = o_.rank;
  mine.host = LocalHostName();
  mine.pid = static_cast<uint64_t>(getpid());
  mine.addresses.resize(o_.world_size);
  std::string error;
  if (!CatchGloo(
          [&] {
            context = device->createContext(o_.rank, o_.world_size);
            // Pairs take this as their connect timeout when created.
            context->setTimeout(std::max(Millis(1), Until(deadline_)));
            for (int p = 0; p < o_.world_size; ++p) {
              if (p == o_.rank) continue;
              std::vector<char> a = context->createPair(p)->address().bytes();
              mine.addresses[p].assign(a.begin(), a.end());
            }
          },
          &error)) {
    return IoError("gloo: " + who_ + " could not open its listening sockets on " + device->str() + ": " + error);
  }

  DCKPT_RETURN_IF_ERROR(Publish(EncodePublished(mine)));
  std::vector<Published> peers(o_.world_size);
  DCKPT_RETURN_IF_ERROR(AwaitAndFetch(&peers));

  for (int p = 0; p < o_.world_size; ++p) {
    if (p == o_.rank) continue;
    const std::string& addr = peers[p].addresses[o_.rank];
    if (!CatchGloo([&] { context->getPair(p)->connect(std::vector<char>(addr.begin(), addr.end())); }, &error)) {
      const bool timed_out = error.find("imeout") != std::string::npos || Clock::now() >= deadline_;
      std::string msg = "gloo: " + who_ + " could not connect to rank " + std::to_string(p) + " (" +
                        peers[p].Describe() + ") at " + AddressString(addr) + " within " +
                        std::to_string(CountMs(o_.timeout)) + " ms (rendezvous " + where_ + "): " + error;
      return timed_out ? TimeoutError(msg) : IoError(msg);
    }
  }

  return ConnectedTransport{std::move(device), std::move(context)};
}

std::string Rendezvous::Key(int rank) const {
  return (o_.prefix.empty() ? "" : o_.prefix + "/") + "dckpt.gloo.addr." + std::to_string(rank);
}

Status Rendezvous::OpenStore(const Target& target) {
  std::string error;
  if (target.kind == Target::kFile) {
    DCKPT_RETURN_IF_ERROR(MakeDirs(target.path));
    if (!CatchGloo([&] { store_ = std::make_unique<FileStore>(target.path); }, &error)) {
      return IoError("gloo: cannot use the rendezvous directory '" + target.path + "': " + error);
    }
    return OkStatus();
  }
  if (!CatchGloo([&] { store_ = std::make_unique<RedisStore>(target.host, target.port); }, &error)) {
    return IoError("gloo: cannot reach the Redis rendezvous store at " + target.host + ":" +
                   std::to_string(target.port) + " (" + o_.rendezvous + ") from " + who_ + ": " + error);
  }
  return OkStatus();
}

Status Rendezvous::CreateDevice(std::shared_ptr<gloo::transport::Device>* device) {
  gloo::transport::tcp::attr attr;
  std::string what;
  if (!o_.iface.empty()) {
    attr.iface = o_.iface;
    what = "network interface '" + o_.iface + "'";
  } else {
    attr.hostname = o_.hostname.empty() ? LocalHostName() : o_.hostname;
    what = o_.hostname.empty() ? "this host's name '" + attr.hostname + "'" : "address '" + o_.hostname + "'";
    // Gloo resolves the name itself but reads an unset result when getaddrinfo fails (it only checks for -1), and
    // crashes: a name that does not resolve (a container without /etc/hosts, a typo) is refused here first.
    struct addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* found = nullptr;
    const int rc = getaddrinfo(attr.hostname.c_str(), nullptr, &hints, &found);
    if (found != nullptr) freeaddrinfo(found);
    if (rc != 0 || found == nullptr) {
      return InvalidArgument(
          "gloo: " + who_ + " cannot bind to " + what + ": it does not resolve to an address (" +
          (rc != 0 ? gai_strerror(rc) : "no address") +
          "); name the address or interface to bind with GlooOptions::hostname/iface or "
          "DCKPT_GLOO_HOSTNAME/DCKPT_GLOO_IFACE (e.g. DCKPT_GLOO_HOSTNAME=127.0.0.1 on one machine)");
    }
  }
  std::string error;
  if (!CatchGloo([&] { *device = gloo::transport::tcp::CreateDevice(attr); }, &error)) {
    return InvalidArgument("gloo: " + who_ + " cannot bind to " + what +
                           " (set GlooOptions::iface/hostname or DCKPT_GLOO_IFACE/DCKPT_GLOO_HOSTNAME): " + error);
  }
  return OkStatus();
}

Status Rendezvous::Publish(const std::string& blob) {
  std::string error;
  if (!CatchGloo([&] { store_->Set(Key(o_.rank), blob); }, &error)) {
    if (error.find("already") != std::string::npos) {
      return Status(StatusCode::kExists,
                    "gloo: the rendezvous key of " + who_ + " already exists in " + where_ +
                        ": a group using this prefix is running, or one crashed before cleaning up; use a fresh "
                        "prefix or directory for each group: " +
                        error);
    }
    return IoError("gloo: " + who_ + " cannot publish its address in " + where_ + ": " + error);
  }
  published_ = true;
  return OkStatus();
}

Status Rendezvous::AwaitAndFetch(std::vector<Published>* peers) {
  std::string error;
  // Wait for the ranks in order; a rank's key, once there, stays, so each is checked until it appears and then
  // never again. Polling is what Gloo's stores offer (inotify fails on shared file systems); it backs off to 50 ms.
  Millis nap(2);
  for (int p = 0; p < o_.world_size; ++p) {
    for (;;) {
      bool present = false;
      if (!CatchGloo([&] { present = store_->Has(Key(p)); }, &error)) {
        return IoError("gloo: " + who_ + " cannot read the rendezvous store " + where_ + ": " + error);
      }
      if (present) break;
      if (Clock::now() >= deadline_) return MissingRanks(p);
      std::this_thread::sleep_for(std::min(nap, Until(deadline_) + Millis(1)));
      nap = std::min(nap * 2, Millis(50));
    }
  }
  for (int p = 0; p < o_.world_size; ++p) {
    if (p == o_.rank) continue;
    std::string blob;
    if (!CatchGloo([&] { blob = store_->Get(Key(p)); }, &error)) {
      return IoError("gloo: " + who_ + " cannot read rank " + std::to_string(p) + "'s address from " + where_ + ": " +
                     error);
    }
    Published& peer = (*peers)[p];
    if (!DecodePublished(blob, &peer) || peer.rank != p) {
      return IoError("gloo: rank " + std::to_string(p) + "'s entry in " + where_ +
                     " is not a distckpt address record (another program using the same store and prefix?)");
    }
    if (peer.world_size != o_.world_size) {
      return InvalidArgument("gloo: rank " + std::to_string(p) + " (" + peer.Describe() + ") joined with world size " +
                             std::to_string(peer.world_size) + " but " + who_ + " with " +
                             std::to_string(o_.world_size) + " (rendezvous " + where_ + ")");
    }
  }
  return OkStatus();
}

Status Rendezvous::MissingRanks(int first) {
  std::vector<int> missing{first};
  std::string error;
  for (int p = first + 1; p < o_.world_size; ++p) {
    bool present = true;
    CatchGloo([&] { present = store_->Has(Key(p)); }, &error);
    if (!present) missing.push_back(p);
  }
  return TimeoutError("gloo: rendezvous through " + where_ + " timed out after " + std::to_string(CountMs(o_.timeout)) +
                      " ms on " + who_ + ": " + RankWord(missing) + " " + JoinRanks(missing) + " never published " +
                      (missing.size() == 1 ? "its" : "their") +
                      " address (not started, crashed, or using a different rendezvous, prefix or world size)");
}

void Rendezvous::RemoveOwnKey() {
  if (!published_ || !store_) return;
  published_ = false;
  std::string ignored;
  CatchGloo([&] { store_->Remove(Key(o_.rank)); }, &ignored);
}

}  // namespace internal_gloo
}  // namespace distckpt
