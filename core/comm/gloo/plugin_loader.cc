// The core's side of plugin_abi.h: finding and loading libdistckpt_gloo.so, and the Communicator over its table.
#include "core/comm/gloo/plugin_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/version.h"

namespace distckpt {
namespace internal_gloo {
namespace {

using Millis = std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------------------------
// The communicator over the plugin's table. Results come back through host buffers (std::string here).

char* ResizeString(void* buf, size_t n) noexcept {
  try {
    auto* s = static_cast<std::string*>(buf);
    s->resize(n);
    return s->data();
  } catch (...) {
    return nullptr;
  }
}

dckpt_gloo_plugin_bytes BytesOf(std::string* s) { return dckpt_gloo_plugin_bytes{s, ResizeString}; }

// A status from the plugin; its codes are the core's StatusCode values (plugin_abi.h).
Status FromPlugin(int code, std::string message) {
  if (code == 0) return OkStatus();
  if (code < 0 && code >= static_cast<int>(StatusCode::kInternal)) {
    const auto c = static_cast<StatusCode>(code);
    if (message.empty()) message = std::string("gloo: the plugin failed (") + StatusCodeName(c) + ") with no message";
    return Status(c, std::move(message));
  }
  return Internal("gloo: the plugin returned the unknown status " + std::to_string(code) +
                  (message.empty() ? "" : ": " + message));
}

class PluginCommunicator final : public Communicator {
 public:
  PluginCommunicator(const dckpt_gloo_plugin_api* api, dckpt_gloo_plugin_comm* comm)
      : api_(api), comm_(comm), rank_(api->rank(comm)), size_(api->size(comm)) {}
  ~PluginCommunicator() override { api_->destroy(comm_); }
  PluginCommunicator(const PluginCommunicator&) = delete;
  PluginCommunicator& operator=(const PluginCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "gloo"; }

  Status AllGather(const std::string& mine, std::vector<std::string>* all, Millis timeout) override {
    all->clear();
    std::vector<std::string> parts(size_);
    std::vector<dckpt_gloo_plugin_bytes> into = Sinks(&parts);
    std::string message;
    dckpt_gloo_plugin_bytes m = BytesOf(&message);
    const int code = api_->all_gather(comm_, mine.data(), mine.size(), into.data(), timeout.count(), &m);
    DCKPT_RETURN_IF_ERROR(FromPlugin(code, std::move(message)));
    *all = std::move(parts);
    return OkStatus();
  }

  Status Gather(const std::string& mine, int root, std::vector<std::string>* all, Millis timeout) override {
    all->clear();
    std::vector<std::string> parts(size_);
    std::vector<dckpt_gloo_plugin_bytes> into = Sinks(&parts);
    std::string message;
    dckpt_gloo_plugin_bytes m = BytesOf(&message);
    const int code = api_->gather(comm_, mine.data(), mine.size(), root, into.data(), timeout.count(), &m);
    DCKPT_RETURN_IF_ERROR(FromPlugin(code, std::move(message)));
    if (rank_ == root) *all = std::move(parts);
    return OkStatus();
  }

  Status Broadcast(std::string* data, int root, Millis timeout) override {
    std::string message;
    dckpt_gloo_plugin_bytes m = BytesOf(&message);
    dckpt_gloo_plugin_bytes out = BytesOf(data);  // The plugin reads *data before it writes it (plugin_abi.h).
    const int code = api_->broadcast(comm_, data->data(), data->size(), root, &out, timeout.count(), &m);
    return FromPlugin(code, std::move(message));
  }

  Status Barrier(Millis timeout) override {
    std::string message;
    dckpt_gloo_plugin_bytes m = BytesOf(&message);
    const int code = api_->barrier(comm_, timeout.count(), &m);
    return FromPlugin(code, std::move(message));
  }

  // Received straight into the caller's strings: their capacity is reused, as the interface promises.
  Status SendRecv(const std::vector<std::pair<int, std::string_view>>& sends,
                  const std::vector<std::pair<int, std::string*>>& recvs, Millis timeout) override {
    std::vector<dckpt_gloo_plugin_send> s;
    s.reserve(sends.size());
    for (const auto& [peer, bytes] : sends) s.push_back({peer, bytes.data(), bytes.size()});
    std::vector<dckpt_gloo_plugin_recv> r;
    r.reserve(recvs.size());
    for (const auto& [peer, into] : recvs) r.push_back({peer, BytesOf(into)});
    std::string message;
    dckpt_gloo_plugin_bytes m = BytesOf(&message);
    const int code = api_->send_recv(comm_, s.data(), s.size(), r.data(), r.size(), timeout.count(), &m);
    return FromPlugin(code, std::move(message));
  }

  Status SendRecvInto(const std::vector<std::pair<int, std::string_view>>& sends, const std::vector<RecvInto>& recvs,
                      Millis timeout) override {
    std::vector<dckpt_gloo_plugin_send> s;
    s.reserve(sends.size());
    for (const auto& [peer, bytes] : sends) s.push_back({peer, bytes.data(), bytes.size()});
    std::vector<dckpt_gloo_plugin_recv_into> r;
    r.reserve(recvs.size());
    for (const RecvInto& into : recvs) r.push_back({into.peer, into.data, into.size});
    std::string message;
    dckpt_gloo_plugin_bytes m = BytesOf(&message);
    const int code = api_->send_recv_into(comm_, s.data(), s.size(), r.data(), r.size(), timeout.count(), &m);
    return FromPlugin(code, std::move(message));
  }

  void Abort(const std::string& reason) override { api_->abort(comm_, reason.c_str()); }

 private:
  static std::vector<dckpt_gloo_plugin_bytes> Sinks(std::vector<std::string>* parts) {
    std::vector<dckpt_gloo_plugin_bytes> sinks;
    sinks.reserve(parts->size());
    for (std::string& p : *parts) sinks.push_back(BytesOf(&p));
    return sinks;
  }

  const dckpt_gloo_plugin_api* const api_;
  dckpt_gloo_plugin_comm* const comm_;
  const int rank_;
  const int size_;
};

// ---------------------------------------------------------------------------------------------------------------
// Finding and loading the plugin.

constexpr char kEnv[] = "DCKPT_GLOO_PLUGIN";

std::string Dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash == 0 ? 1 : slash);
}

std::string Join(const std::string& dir, const char* file) { return dir == "/" ? dir + file : dir + "/" + file; }

// The file this code was loaded from: libdistckpt.so, an extension module, or the executable.
std::string ThisBinary() {
  Dl_info info;
  link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(&ThisBinary), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0) {
    return "";
  }
  if (map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') return map->l_name;
  // The executable: dladdr names it by argv[0], which may be relative to a directory the process has left.
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return info.dli_fname != nullptr ? info.dli_fname : "";
  return std::string(buf, static_cast<size_t>(n));
}

// dlerror()'s text without the leading "<path>: " it often repeats.
std::string Reason(const std::string& path, const char* error) {
  std::string e = error != nullptr ? error : "dlopen failed";
  if (e.rfind(path + ": ", 0) == 0) e.erase(0, path.size() + 2);
  return e;
}

struct Attempt {
  std::string path;
  std::string reason;
  bool other_version = false;    // A Gloo plugin, but not of this build.
  bool runtime_too_old = false;  // The dynamic loader found the plugin but not the C/C++ runtime versions it needs.
};

// Loads one candidate; nullptr (with attempt->reason) if it is not this build's plugin, which is then unloaded.
const dckpt_gloo_plugin_api* TryLoad(Attempt* attempt) {
  const std::string& path = attempt->path;
  ::dlerror();
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    attempt->reason = Reason(path, ::dlerror());
    // "version `GLIBC_2.34' not found", "version `GLIBCXX_3.4.30' not found": the file is there, the system is older.
    for (const char* runtime : {"`GLIBC_", "`GLIBCXX_", "`CXXABI_"}) {
      if (attempt->reason.find(runtime) != std::string::npos &&
          attempt->reason.find("not found") != std::string::npos) {
        attempt->runtime_too_old = true;
      }
    }
    return nullptr;
  }
  auto reject = [&](std::string reason, bool other_version) -> const dckpt_gloo_plugin_api* {
    attempt->reason = std::move(reason);
    attempt->other_version = other_version;
    ::dlclose(lib);
    return nullptr;
  };
  auto entry = reinterpret_cast<dckpt_gloo_plugin_entry_fn>(::dlsym(lib, DCKPT_GLOO_PLUGIN_ENTRY));
  if (entry == nullptr) {
    return reject(std::string("not a distckpt Gloo plugin: it has no symbol ") + DCKPT_GLOO_PLUGIN_ENTRY, false);
  }
  const dckpt_gloo_plugin_api* api = entry();
  const std::string ours =
      std::string("distckpt ") + kVersionString + " (plugin ABI " + std::to_string(DCKPT_GLOO_PLUGIN_ABI) + ")";
  if (api == nullptr) return reject("its " + std::string(DCKPT_GLOO_PLUGIN_ENTRY) + "() returned no table", false);
  if (api->abi != DCKPT_GLOO_PLUGIN_ABI) {
    return reject("a Gloo plugin of plugin ABI " + std::to_string(api->abi) + ", but this library is " + ours, true);
  }
  if (api->struct_size != sizeof(dckpt_gloo_plugin_api)) {
    return reject("a Gloo plugin whose table has " + std::to_string(api->struct_size) + " bytes, but this library (" +
                      ours + ") expects " + std::to_string(sizeof(dckpt_gloo_plugin_api)),
                  true);
  }
  const std::string theirs = api->version != nullptr ? api->version : "(no version)";
  if (theirs != kVersionString) {
    return reject("the Gloo plugin of distckpt " + theirs + ", but this library is " + ours +
                      ": the plugin must come from the same build",
                  true);
  }
  return api;  // Never unloaded: communicators may outlive anything that would unload it.
}

// `binary`: the file holding the loader, where the plugin was looked for (without DCKPT_GLOO_PLUGIN).
Status NotLoaded(const std::vector<Attempt>& attempts, bool from_env, const std::string& binary) {
  std::string tried;
  bool other_version = false;
  bool runtime_too_old = false;
  for (const Attempt& a : attempts) {
    tried += (tried.empty() ? "" : "; ") + a.path + ": " + a.reason;
    other_version |= a.other_version;
    runtime_too_old |= a.runtime_too_old;
  }
  const std::string plugin = std::string(DCKPT_GLOO_PLUGIN_FILE " of distckpt ") + kVersionString;
  std::string msg = "gloo: the Gloo communicator needs the plugin " DCKPT_GLOO_PLUGIN_FILE
                    " (Gloo and its libraries are loaded on demand, not linked into libdistckpt), and ";
  if (from_env) {
    msg += std::string(kEnv) + "=" + tried + ". Point " + kEnv + " at the " + plugin +
           ", or unset it to use the one beside " + (binary.empty() ? "libdistckpt.so" : binary);
  } else if (runtime_too_old) {
    msg += "it needs a newer C or C++ runtime than this system has (tried " + tried +
           "): the plugin links the gloo of the system it was built on and carries that system's floor, higher than "
           "the rest of distckpt's (share/distckpt/PORTABILITY, or PORTABILITY in the Python package, names it); "
           "only the Gloo communicator is affected. Build the plugin on this system (scripts/build_lib.sh) and set " +
           std::string(kEnv) + " to it";
  } else {
    msg += "none could be loaded (tried " + (tried.empty() ? std::string("nothing: no binary found") : tried) +
           "). Put the " + plugin + " beside " + (binary.empty() ? "libdistckpt.so" : binary) +
           " with its distckpt.libs/ (scripts/build_lib.sh installs them beside libdistckpt.so in lib/; the Python "
           "package has them beside its extension module), or set " +
           kEnv + "=/path/" DCKPT_GLOO_PLUGIN_FILE;
  }
  msg +=
      "; or use the collectives your application already has instead: an external communicator (C "
      "dckpt_comm_new_external, Python distckpt.comm.from_torch or distckpt.comm.from_mpi4py, Rust Comm::external)";
  return Status(other_version ? StatusCode::kVersion : StatusCode::kUnsupported, std::move(msg));
}

}  // namespace
}  // namespace internal_gloo

std::vector<std::string> GlooPluginCandidates() {
  using internal_gloo::Dir;
  using internal_gloo::Join;
  const char* env = std::getenv(internal_gloo::kEnv);
  if (env != nullptr && env[0] != '\0') return {env};
  std::vector<std::string> candidates;
  const std::string binary = internal_gloo::ThisBinary();
  if (!Dir(binary).empty()) candidates.push_back(Join(Dir(binary), DCKPT_GLOO_PLUGIN_FILE));
  if (char* real = ::realpath(binary.c_str(), nullptr)) {
    const std::string dir = Dir(real);
    ::free(real);
    const std::string candidate = Join(dir, DCKPT_GLOO_PLUGIN_FILE);
    if (!dir.empty() && std::find(candidates.begin(), candidates.end(), candidate) == candidates.end()) {
      candidates.push_back(candidate);
    }
  }
  return candidates;
}

Result<const dckpt_gloo_plugin_api*> LoadGlooPlugin() {
  // Never destroyed: a thread may still use the plugin while the process exits.
  static std::mutex* mu = new std::mutex();
  static const dckpt_gloo_plugin_api* loaded = nullptr;
  std::lock_guard<std::mutex> lock(*mu);
  if (loaded != nullptr) return loaded;
  const char* env = std::getenv(internal_gloo::kEnv);
  std::vector<internal_gloo::Attempt> attempts;
  for (std::string& path : GlooPluginCandidates()) {
    attempts.push_back({std::move(path), "", false});
    if (const dckpt_gloo_plugin_api* api = internal_gloo::TryLoad(&attempts.back())) {
      loaded = api;
      return loaded;
    }
  }
  return internal_gloo::NotLoaded(attempts, env != nullptr && env[0] != '\0', internal_gloo::ThisBinary());
}

Result<std::unique_ptr<Communicator>> NewGlooCommunicatorFromPlugin(const GlooOptions& options) {
  DCKPT_RETURN_IF_ERROR(CheckGlooOptions(options));
  DCKPT_ASSIGN_OR_RETURN(const dckpt_gloo_plugin_api* api, LoadGlooPlugin());
  const dckpt_gloo_plugin_options o = {options.rank,           options.world_size,    options.rendezvous.c_str(),
                                       options.prefix.c_str(), options.iface.c_str(), options.hostname.c_str(),
                                       options.timeout.count()};
  dckpt_gloo_plugin_comm* comm = nullptr;
  std::string message;
  dckpt_gloo_plugin_bytes m = internal_gloo::BytesOf(&message);
  const int code = api->create(&comm, &o, &m);
  DCKPT_RETURN_IF_ERROR(internal_gloo::FromPlugin(code, std::move(message)));
  if (comm == nullptr) return Internal("gloo: the plugin reported success but made no communicator");
  std::unique_ptr<dckpt_gloo_plugin_comm, void (*)(dckpt_gloo_plugin_comm*)> owned(comm, api->destroy);
  auto adapter = std::make_unique<internal_gloo::PluginCommunicator>(api, owned.get());
  owned.release();  // The adapter destroys it now.
  return std::unique_ptr<Communicator>(std::move(adapter));
}

}  // namespace distckpt
