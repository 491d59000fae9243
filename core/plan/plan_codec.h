// Binary messages for the save-planning collective: each rank sends its LocalPlan to the coordinator and gets its
// RankAssignment back. Little-endian varints (core/base/wire.h); decoding treats the input as hostile.
#ifndef DISTCKPT_CORE_PLAN_PLAN_CODEC_H_
#define DISTCKPT_CORE_PLAN_PLAN_CODEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/plan/save_planner.h"

namespace distckpt {

/// Serialises a local plan. Fails (kInvalidArgument, naming the tensor) on a shape or box with more than kMaxDims
/// dimensions, which no message can carry.
Result<std::string> EncodeLocalPlan(const LocalPlan& plan);

/// Parses EncodeLocalPlan's output. Truncated, trailing or malformed input gives kCorrupt; allocation stays within a
/// small constant factor of the input size. The plan's contents are not validated here (MakeGlobalPlan does that).
Result<LocalPlan> DecodeLocalPlan(std::string_view data);

/// Serialises one rank's share of the global plan.
Result<std::string> EncodeRankAssignment(const RankAssignment& assignment);

/// Parses EncodeRankAssignment's output, with the same guarantees as DecodeLocalPlan.
Result<RankAssignment> DecodeRankAssignment(std::string_view data);

/// What a writer reports once its chunks are written: its status, the bytes it wrote and each chunk's checksums,
/// coding and (for a writer that laid its file out itself) offset and file size. The save's last round, and the
/// checkpoint manager's persisting.
std::string EncodeChunkReports(const Status& status, const std::vector<ChunkChecksums>& reports,
                               uint64_t bytes_written);
/// Appends the reports of EncodeChunkReports' output to `*reports`; `*status` is the writer's. kInternal when
/// malformed.
Status DecodeChunkReports(const std::string& msg, Status* status, std::vector<ChunkChecksums>* reports);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_PLAN_PLAN_CODEC_H_
