// What a save's marker says about its writer: the STAGING file of a staging directory (FORMAT.md 6.1) and the
// STAGING.<nonce> object of the metadata-last layout (6.2) hold the same text (StagingMarkerText). One parser for
// every prune: the core's, and through the C ABI every client's.
#ifndef DISTCKPT_CORE_TOOLS_STAGING_MARKER_H_
#define DISTCKPT_CORE_TOOLS_STAGING_MARKER_H_

#include <ctime>
#include <optional>
#include <string>

namespace distckpt {

struct StagingMarker {
  std::string host;
  long pid = -1;            ///< -1: none, or not a number
  std::string started_utc;  ///< as written ("2026-11-26T18:04:31Z"), or empty
  std::string final_path;
};

/// The fields of a marker's text ("key: value" lines; unknown lines are ignored).
StagingMarker ParseStagingMarker(const std::string& text);

/// Whether the marker's writer is alive. Only a process of this host can be asked.
enum class WriterState { kUnknown, kRunning, kExited };
/// Whether the writer a marker names is running. A marker this very process wrote (same host and pid) names the save
/// `nonce`: running only while that save is (StagedSaveIsLive); a save of this process that failed left it, and its
/// state is then kUnknown (judged by its age). Without a nonce, this process counts as running.
WriterState WriterStateOf(const StagingMarker& marker, const std::string& nonce = "");

/// When the writer started (started_utc), if the marker says so in the expected form.
std::optional<std::time_t> StartedAt(const StagingMarker& marker);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_STAGING_MARKER_H_
