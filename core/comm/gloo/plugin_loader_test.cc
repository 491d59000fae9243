// The Gloo plugin loader (plugin_loader.h) on real files: a missing file, a file that is not ELF, a shared library
// without the entry point, plugins of another distckpt version and of another plugin ABI (testdata/fake_plugin.c),
// each refused with an error naming the file, the reason and the ways out; bad options refused before anything is
// loaded; and the real plugin found beside this test's executable (Bazel builds it into the same directory), loaded
// once, giving a working communicator. Each case runs in a forked child of a parent that never loads a plugin, so a
// case sees a process in which nothing was loaded yet.
#include "core/comm/gloo/plugin_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/runfiles.h"
#include "core/base/testing/status_matchers.h"
#include "core/base/testing/temp_dir.h"
#include "core/base/version.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using comm_testing::AllExitedZero;
using comm_testing::Describe;

constexpr char kEnv[] = "DCKPT_GLOO_PLUGIN";

// Runs `body` in a forked child (a fresh process as far as the loader is concerned); its failures are printed there.
void InChild(const std::function<bool()>& body) {
  auto outcomes = comm_testing::RunRanks(1, std::chrono::seconds(60), [&](int) { return body() ? 0 : 1; });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// Prints why `result` is not the expected failure.
bool Check(const ::testing::AssertionResult& result) {
  if (!result) std::fprintf(stderr, "%s\n", result.message());
  return static_cast<bool>(result);
}

// The lines of /proc/self/maps that name a file containing `name`.
std::vector<std::string> Mapped(const std::string& name) {
  std::vector<std::string> lines;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

// What every refusal names besides the file and the reason: the ways out.
const std::vector<std::string> kWaysOut = {kEnv, "dckpt_comm_new_external", "distckpt.comm.from_torch",
                                           "distckpt.comm.from_mpi4py"};

std::vector<std::string> Mentions(std::vector<std::string> words) {
  words.insert(words.end(), kWaysOut.begin(), kWaysOut.end());
  return words;
}

// The loader refuses DCKPT_GLOO_PLUGIN=`path`: `code` and a message with every word of `mentions` and the ways out.
// A Gloo communicator is refused the same way, and a rejected library is unloaded again.
bool Refuses(const std::string& path, StatusCode code, const std::vector<std::string>& mentions) {
  ::setenv(kEnv, path.c_str(), 1);
  if (GlooPluginCandidates() != std::vector<std::string>{path}) {
    std::fprintf(stderr, "candidates other than %s=%s alone\n", kEnv, path.c_str());
    return false;
  }
  const Result<const dckpt_gloo_plugin_api*> api = LoadGlooPlugin();
  if (!Check(StatusIs(api.ok() ? OkStatus() : api.status(), code, Mentions(mentions)))) return false;
  const std::string dir = testing_util::MakeTempDir("plugin-refused-");
  auto comm = NewGlooCommunicatorFromPlugin(gloo_testing::Loopback(0, 1, "file://" + dir));
  if (!Check(StatusIs(comm.ok() ? OkStatus() : comm.status(), code, Mentions(mentions)))) return false;
  const std::string file = path.substr(path.rfind('/') + 1);
  if (!Mapped(file).empty()) {
    std::fprintf(stderr, "%s is still mapped after it was refused: %s\n", file.c_str(), Mapped(file)[0].c_str());
    return false;
  }
  return true;
}

TEST(GlooPluginLoader, MissingFileIsNamed) {
  InChild([] {
    const std::string path = testing_util::MakeTempDir("plugin-missing-") + "/libdistckpt_gloo.so";
    return Refuses(path, StatusCode::kUnsupported,
                   {path, "No such file or directory", "needs the plugin libdistckpt_gloo.so"});
  });
}

TEST(GlooPluginLoader, FileThatIsNotElfIsNamed) {
  InChild([] {
    const std::string path = testing_util::MakeTempDir("plugin-text-") + "/libdistckpt_gloo.so";
    testing_util::WriteStringToFile(path, std::string(200, '#') + "\nnot a shared library\n");
    return Refuses(path, StatusCode::kUnsupported, {path, "invalid ELF header"});
  });
}

TEST(GlooPluginLoader, LibraryWithoutTheEntryPointIsNamed) {
  const std::string path = testing_util::Runfile("core/comm/gloo/libfake_gloo_plugin_no_entry.so");
  ASSERT_FALSE(path.empty()) << "the stand-in is not in the runfiles";
  InChild([&] { return Refuses(path, StatusCode::kUnsupported, {path, "no symbol dckpt_gloo_plugin_entry"}); });
}

TEST(GlooPluginLoader, PluginOfAnotherVersionIsRefused) {
  const std::string path = testing_util::Runfile("core/comm/gloo/libfake_gloo_plugin_other_version.so");
  ASSERT_FALSE(path.empty()) << "the stand-in is not in the runfiles";
  InChild([&] {
    return Refuses(path, StatusCode::kVersion,
                   {path, "distckpt 0.0.1-other", std::string("distckpt ") + kVersionString, "same build"});
  });
}

TEST(GlooPluginLoader, PluginOfAnotherAbiIsRefused) {
  const std::string path = testing_util::Runfile("core/comm/gloo/libfake_gloo_plugin_other_abi.so");
  ASSERT_FALSE(path.empty()) << "the stand-in is not in the runfiles";
  InChild([&] { return Refuses(path, StatusCode::kVersion, {path, "plugin ABI 99", "plugin ABI 3)"}); });
}

// Bad options fail as they do without the plugin: before it is looked for.
TEST(GlooPluginLoader, BadOptionsAreRefusedBeforeLoading) {
  InChild([] {
    ::setenv(kEnv, "/nonexistent/libdistckpt_gloo.so", 1);
    GlooOptions o = gloo_testing::Loopback(0, 1, "ftp://host/dir");
    auto comm = NewGlooCommunicatorFromPlugin(o);
    if (!Check(StatusIs(comm.ok() ? OkStatus() : comm.status(), StatusCode::kInvalidArgument, {"ftp://host/dir"}))) {
      return false;
    }
    o = gloo_testing::Loopback(2, 2, "file:///tmp");
    comm = NewGlooCommunicatorFromPlugin(o);
    return Check(StatusIs(comm.ok() ? OkStatus() : comm.status(), StatusCode::kInvalidArgument, {"rank 2"}));
  });
}

// Without DCKPT_GLOO_PLUGIN: beside the binary holding the loader, here the test executable, whose directory holds
// the plugin Bazel built. A failure first is not remembered; the plugin, once loaded, is loaded once.
TEST(GlooPluginLoader, FoundBesideTheExecutableAndLoadedOnce) {
  InChild([] {
    ::setenv(kEnv, "/nonexistent/libdistckpt_gloo.so", 1);
    if (LoadGlooPlugin().ok()) return false;
    ::unsetenv(kEnv);
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return false;
    const std::string self(exe, static_cast<size_t>(n));
    const std::string beside = self.substr(0, self.rfind('/')) + "/libdistckpt_gloo.so";
    const std::vector<std::string> candidates = GlooPluginCandidates();
    if (candidates != std::vector<std::string>{beside}) {
      for (const std::string& c : candidates) std::fprintf(stderr, "candidate: %s\n", c.c_str());
      std::fprintf(stderr, "want only %s\n", beside.c_str());
      return false;
    }
    if (!Mapped("libgloo").empty() || !Mapped("libdistckpt_gloo").empty()) {
      std::fprintf(stderr, "Gloo is mapped before the plugin was loaded\n");
      return false;
    }
    auto api = LoadGlooPlugin();
    if (!api.ok()) return Check(StatusIs(api.status(), StatusCode::kOk));
    if (std::string((*api)->version) != kVersionString) return false;
    ::setenv(kEnv, "/nonexistent/libdistckpt_gloo.so", 1);  // Loaded already: not looked for again.
    auto again = LoadGlooPlugin();
    if (!again.ok() || *again != *api) return false;
    const std::string dir = testing_util::MakeTempDir("plugin-found-");
    auto comm = NewGlooCommunicatorFromPlugin(gloo_testing::Loopback(0, 1, "file://" + dir));
    if (!comm.ok()) return Check(StatusIs(comm.status(), StatusCode::kOk));
    if ((*comm)->name() != "gloo" || (*comm)->rank() != 0 || (*comm)->size() != 1) return false;
    if (!Check(StatusIs((*comm)->Barrier(std::chrono::seconds(10)), StatusCode::kOk))) return false;
    const auto plugin = Mapped("libdistckpt_gloo.so");
    if (plugin.empty() || plugin[0].find(beside) == std::string::npos || Mapped("libgloo").empty()) {
      std::fprintf(stderr, "the plugin from %s and libgloo are not both mapped\n", beside.c_str());
      return false;
    }
    return true;
  });
}

}  // namespace
}  // namespace distckpt
