// The Gloo plugin through the C ABI, as an application linked to libdistckpt.so sees it: saving, loading, reading,
// exporting and the checkpoint manager with a single-process or external communicator never map the plugin or Gloo
// (/proc/self/maps); the first Gloo communicator loads libdistckpt_gloo.so from beside libdistckpt.so's real path
// (Bazel links it through _solib); a missing plugin is DCKPT_EUNSUPPORTED naming the file, the reason and the ways
// out, and bad options are DCKPT_EINVAL whether or not the plugin is there. Each case runs in a forked child, so a
// case sees a process that has loaded nothing yet.
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "gtest/gtest.h"

namespace {

// Runs `body` in a forked child; it prints its failures there. The parent loads neither the plugin nor Gloo.
void InChild(const std::function<bool()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    const bool ok = body();
    std::fflush(nullptr);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed (its output is above)";
}

bool Ok(int rc, const char* what) {
  if (rc == DCKPT_OK) return true;
  std::fprintf(stderr, "%s: %d %s\n", what, rc, dckpt_error_last());
  return false;
}

// The mapped files whose name contains `name`.
std::vector<std::string> Mapped(const std::string& name) {
  std::vector<std::string> files;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos && line.find(name, slash) != std::string::npos) files.push_back(line.substr(slash));
  }
  return files;
}

bool NothingOfGlooMapped(const char* after) {
  for (const char* lib : {"libdistckpt_gloo", "libgloo", "libhiredis", "libibverbs"}) {
    if (!Mapped(lib).empty()) {
      std::fprintf(stderr, "after %s, %s is mapped: %s\n", after, lib, Mapped(lib)[0].c_str());
      return false;
    }
  }
  return true;
}

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr && *base ? base : "/tmp") + "/gloo-plugin-capi-XXXXXX";
  return mkdtemp(&pattern[0]) != nullptr ? pattern : "";
}

// The options of a group of one on loopback; `rendezvous` must outlive them.
dckpt_gloo_options OneRank(const std::string& rendezvous) {
  dckpt_gloo_options o;
  dckpt_gloo_options_init(&o, DCKPT_GLOO_OPTIONS_VERSION);
  o.rank = 0;
  o.world_size = 1;
  o.rendezvous = rendezvous.c_str();
  o.hostname = "127.0.0.1";
  return o;
}

// A one-rank external communicator: the host's collectives, trivially.
int Allgather(const void* send, size_t size, void* recv, uint64_t, void*) {
  if (size > 0) std::memcpy(recv, send, size);
  return 0;
}
int Broadcast(void*, size_t, int, uint64_t, void*) { return 0; }

TEST(GlooPluginCapi, NothingButAGlooCommunicatorLoadsIt) {
  InChild([] {
    const std::string dir = TempDir();
    float w[6] = {1, 2, 3, 4, 5, 6};
    const uint64_t shape[2] = {2, 3}, off[2] = {0, 0};
    dckpt_state* s = nullptr;
    if (!Ok(dckpt_state_new(&s), "state") || !Ok(dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape), "tensor") ||
        !Ok(dckpt_state_add_piece(s, "w", off, shape, w), "piece")) {
      return false;
    }
    if (!Ok(dckpt_save(nullptr, (dir + "/single").c_str(), s, nullptr, nullptr), "save (single process)") ||
        !Ok(dckpt_load(nullptr, (dir + "/single").c_str(), s, nullptr, nullptr), "load (single process)")) {
      return false;
    }
    dckpt_reader* r = nullptr;
    if (!Ok(dckpt_reader_open(&r, (dir + "/single").c_str(), nullptr, nullptr), "reader") ||
        !Ok(dckpt_reader_verify(r, nullptr, nullptr), "verify")) {
      return false;
    }
    dckpt_reader_free(r);
    if (mkdir((dir + "/hub").c_str(), 0755) != 0 ||
        !Ok(dckpt_export_safetensors((dir + "/single").c_str(), (dir + "/hub").c_str(), nullptr), "export")) {
      return false;
    }
    dckpt_comm_callbacks cb;
    dckpt_comm_callbacks_init(&cb, DCKPT_COMM_CALLBACKS_VERSION);
    cb.rank = 0;
    cb.size = 1;
    cb.allgather = Allgather;
    cb.broadcast = Broadcast;
    dckpt_comm* external = nullptr;
    if (!Ok(dckpt_comm_new_external(&external, &cb), "external") ||
        !Ok(dckpt_save(nullptr, (dir + "/external").c_str(), s, external, nullptr), "save (external)") ||
        !Ok(dckpt_load(nullptr, (dir + "/external").c_str(), s, external, nullptr), "load (external)")) {
      return false;
    }
    dckpt_comm_free(external);
    dckpt_manager_options mo;
    dckpt_manager_options_init(&mo, DCKPT_MANAGER_OPTIONS_VERSION);
    const std::string local = dir + "/local", persistent = dir + "/persistent";
    mo.local_dir = local.c_str();
    mo.persistent_path = persistent.c_str();
    mo.replicas = 0;
    dckpt_manager* m = nullptr;
    if (!Ok(dckpt_manager_new(&m, nullptr, &mo), "manager") || !Ok(dckpt_manager_save(m, 1, s, 1), "manager save") ||
        !Ok(dckpt_manager_wait(m, DCKPT_WAIT_FOREVER), "manager wait") ||
        !Ok(dckpt_manager_restore(nullptr, m, s, nullptr), "manager restore")) {
      return false;
    }
    dckpt_manager_free(m);
    dckpt_state_free(s);
    if (Mapped("libdistckpt.so").empty()) {
      std::fprintf(stderr, "libdistckpt.so is not mapped: the test does not use the shared library\n");
      return false;
    }
    return NothingOfGlooMapped("saving, loading, reading, exporting and the manager");
  });
}

TEST(GlooPluginCapi, AGlooCommunicatorLoadsThePluginBesideTheLibrary) {
  InChild([] {
    ::unsetenv("DCKPT_GLOO_PLUGIN");
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&dckpt_comm_new_gloo), &info) == 0) return false;
    char* real = realpath(info.dli_fname, nullptr);
    if (real == nullptr) return false;
    std::string beside(real);
    free(real);
    beside = beside.substr(0, beside.rfind('/')) + "/libdistckpt_gloo.so";
    const std::string rendezvous = "file://" + TempDir();
    dckpt_gloo_options o = OneRank(rendezvous);
    dckpt_comm* comm = nullptr;
    if (!NothingOfGlooMapped("loading the library") || !Ok(dckpt_comm_new_gloo(&comm, &o), "gloo") ||
        !Ok(dckpt_comm_barrier(comm, 10000), "barrier")) {
      return false;
    }
    dckpt_comm_free(comm);
    const std::vector<std::string> plugin = Mapped("libdistckpt_gloo.so");
    if (plugin.empty() || plugin[0] != beside || Mapped("libgloo").empty()) {
      std::fprintf(stderr, "want %s and libgloo mapped, have: %s\n", beside.c_str(),
                   plugin.empty() ? "no plugin" : plugin[0].c_str());
      return false;
    }
    return true;
  });
}

TEST(GlooPluginCapi, AMissingPluginIsUnsupportedAndBadOptionsAreStillInvalid) {
  InChild([] {
    const std::string missing = TempDir() + "/libdistckpt_gloo.so";
    ::setenv("DCKPT_GLOO_PLUGIN", missing.c_str(), 1);
    const std::string rendezvous = "file://" + TempDir();
    dckpt_gloo_options o = OneRank(rendezvous);
    dckpt_comm* comm = nullptr;
    int rc = dckpt_comm_new_gloo(&comm, &o);
    const std::string msg = dckpt_error_last();
    bool ok = rc == DCKPT_EUNSUPPORTED && comm == nullptr;
    for (const std::string& word : {missing, std::string("No such file or directory"), std::string("DCKPT_GLOO_PLUGIN"),
                                    std::string("dckpt_comm_new_external")}) {
      ok = ok && msg.find(word) != std::string::npos;
    }
    if (!ok) std::fprintf(stderr, "rc %d: %s\n", rc, msg.c_str());
    o.rank = 5;
    rc = dckpt_comm_new_gloo(&comm, &o);
    if (rc != DCKPT_EINVAL || std::string(dckpt_error_last()).find("rank 5") == std::string::npos) {
      std::fprintf(stderr, "bad options: rc %d: %s\n", rc, dckpt_error_last());
      ok = false;
    }
    return ok && NothingOfGlooMapped("the refusals");
  });
}

}  // namespace
