#include "core/manager/manager_util.h"

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

// A status as a message between ranks, and back.
std::string EncodeStatus(const Status& st) {
  WireWriter w;
  w.Var(static_cast<uint64_t>(-static_cast<int>(st.code())));
  w.Str(st.message());
  return w.Take();
}

Status DecodeStatus(WireReader& r) {
  uint64_t code = 0;
  std::string msg;
  if (!r.Var(&code) || !r.Str(&msg) || code > 64) return Internal("malformed status from a peer");
  return code == 0 ? OkStatus() : Status(static_cast<StatusCode>(-static_cast<int>(code)), msg);
}

// This rank's failure, else the first other rank's (as kPeer naming it), else OK.
Status FirstFailure(const std::vector<Status>& all, int me, const std::string& what) {
  if (me >= 0 && static_cast<size_t>(me) < all.size() && !all[me].ok()) return all[me];
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].ok()) continue;
    if (static_cast<int>(r) == me) return all[r];
    return Status(StatusCode::kPeer, what + ": rank " + std::to_string(r) + " failed: " + all[r].message());
  }
  return OkStatus();
}

// Every rank's status, through one AllGather.
Result<std::vector<Status>> AgreeAll(Communicator* comm, const Status& mine, std::chrono::milliseconds timeout) {
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm->AllGather(EncodeStatus(mine), &all, timeout));
  std::vector<Status> out;
  for (const std::string& s : all) {
    WireReader r(s);
    out.push_back(DecodeStatus(r));
  }
  return out;
}

Status CopyRange(const ReadableFile& from, uint64_t offset, uint64_t size, std::string* out) {
  const size_t at = out->size();
  out->resize(at + size);
  return from.ReadAt(offset, &(*out)[at], size);
}

PhaseTrace::PhaseTrace(std::string what) : on_(std::getenv("DCKPT_MANAGER_TRACE") != nullptr), what_(std::move(what)) {}

PhaseTrace::~PhaseTrace() {
  if (on_) std::fprintf(stderr, "dckpt manager trace: %s:%s\n", what_.c_str(), line_.c_str());
}

void PhaseTrace::Mark(const char* phase) {
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  char buf[96];
  std::snprintf(buf, sizeof buf, " %s %.1f ms", phase, std::chrono::duration<double, std::milli>(now - at_).count());
  line_ += buf;
  at_ = now;
}

}  // namespace manager_internal
}  // namespace distckpt
