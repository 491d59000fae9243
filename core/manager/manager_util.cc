#include "core/manager/manager_util.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace distckpt {
namespace manager_internal {

std::string StepName(uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010llu", static_cast<unsigned long long>(step));
  return buf;
}

std::string PartName(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "part-%05u", rank);
  return buf;
}

std::string CompleteName(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "complete-%05u", rank);
  return buf;
}

// Parses "<prefix><digits>" (exactly `digits` digits).
bool ParseNumbered(const std::string& name, const char* prefix, size_t digits, uint64_t* out) {
  const size_t n = std::strlen(prefix);
  if (name.size() != n + digits || name.compare(0, n, prefix) != 0) return false;
  uint64_t v = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  *out = v;
  return true;
}

Status CommitReceivedPart(Storage* storage, const std::string& staging_dir, const std::string& final_dir,
                          const std::string& step_dir) {
  DCKPT_RETURN_IF_ERROR(storage->RemoveAll(staging_dir + "/" + kStagingMarkerName));
  DCKPT_RETURN_IF_ERROR(storage->SyncDir(staging_dir));
  DCKPT_RETURN_IF_ERROR(storage->RemoveAll(final_dir));
  DCKPT_RETURN_IF_ERROR(storage->Rename(staging_dir, final_dir));
  return storage->SyncDir(step_dir);
}

Status CopyRange(const ReadableFile& from, uint64_t offset, uint64_t size, std::string* out) {
  const size_t at = out->size();
  out->resize(at + size);
  return from.ReadAt(offset, &(*out)[at], size);
}

PhaseTrace::PhaseTrace(std::string what) : on_(std::getenv("DCKPT_MANAGER_TRACE") != nullptr), what_(std::move(what)) {}

PhaseTrace::~PhaseTrace() {
  if (!on_) return;
  for (const auto& [part, total] : parts_) {
    char buf[128];
    std::snprintf(buf, sizeof buf, " [%s %.1f ms x%llu]", part.c_str(), total.first,
                  static_cast<unsigned long long>(total.second));
    line_ += buf;
  }
  std::fprintf(stderr, "dckpt manager trace: %s:%s\n", what_.c_str(), line_.c_str());
}

void PhaseTrace::Add(const char* part, std::chrono::steady_clock::time_point since) {
  if (!on_) return;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
  std::lock_guard<std::mutex> lock(mu_);
  auto& total = parts_[part];
  total.first += ms;
  ++total.second;
}

namespace {

// DCKPT_TEST_MANAGER_KILL_AT (manager_util.h).
void KillIfAsked(const std::string& what, const char* phase) {
  static const std::pair<std::string, std::string> at = [] {
    const char* v = std::getenv("DCKPT_TEST_MANAGER_KILL_AT");
    const std::string text = v ? v : "";
    const size_t sep = text.find('@');
    return sep == std::string::npos ? std::make_pair(text, std::string())
                                    : std::make_pair(text.substr(0, sep), text.substr(sep + 1));
  }();
  if (at.first.empty() || at.first != phase || what.find(at.second) == std::string::npos) return;
  std::fprintf(stderr, "dckpt manager: %s: killed after phase '%s' as DCKPT_TEST_MANAGER_KILL_AT asks\n", what.c_str(),
               phase);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace

void PhaseTrace::Mark(const char* phase) {
  KillIfAsked(what_, phase);
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  char buf[96];
  std::snprintf(buf, sizeof buf, " %s %.1f ms", phase, std::chrono::duration<double, std::milli>(now - at_).count());
  line_ += buf;
  at_ = now;
}

}  // namespace manager_internal
}  // namespace distckpt
