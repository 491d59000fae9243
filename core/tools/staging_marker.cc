#include "core/tools/staging_marker.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "core/storage/storage.h"

namespace distckpt {

StagingMarker ParseStagingMarker(const std::string& text) {
  StagingMarker m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(": ");
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon), value = line.substr(colon + 2);
    if (key == "host") {
      m.host = value;
    } else if (key == "pid") {
      char* end = nullptr;
      const long pid = std::strtol(value.c_str(), &end, 10);
      m.pid = (end != value.c_str() && *end == '\0' && pid > 0) ? pid : -1;
    } else if (key == "started_utc") {
      m.started_utc = value;
    } else if (key == "final_path") {
      m.final_path = value;
    }
  }
  return m;
}

WriterState WriterStateOf(const StagingMarker& marker, const std::string& nonce) {
  char host[256] = {};
  if (marker.pid <= 0 || marker.host.empty() || gethostname(host, sizeof(host) - 1) != 0 || marker.host != host) {
    return WriterState::kUnknown;
  }
  if (marker.pid == static_cast<long>(getpid()) && !nonce.empty()) {
    return StagedSaveIsLive(nonce) ? WriterState::kRunning : WriterState::kUnknown;
  }
  if (kill(static_cast<pid_t>(marker.pid), 0) == 0 || errno == EPERM) return WriterState::kRunning;
  return errno == ESRCH ? WriterState::kExited : WriterState::kUnknown;
}

std::optional<std::time_t> StartedAt(const StagingMarker& marker) {
  std::tm tm{};
  const char* end = strptime(marker.started_utc.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return timegm(&tm);
}

}  // namespace distckpt
