// Internal to the Gloo backend: the small helpers its transport (gloo.cc) and its rendezvous (gloo_rendezvous.cc)
// share: deadline arithmetic, rank lists in messages, and Gloo's exceptions turned into message strings.
#ifndef DISTCKPT_CORE_COMM_GLOO_GLOO_UTIL_H_
#define DISTCKPT_CORE_COMM_GLOO_GLOO_UTIL_H_

#include <chrono>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/comm/collective_call.h"
#include "gloo/common/error.h"

namespace distckpt {
namespace internal_gloo {

using internal_comm::Clock;
using internal_comm::Millis;

inline long long CountMs(Millis d) { return static_cast<long long>(d.count()); }

inline Millis Until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return left.count() < 0 ? Millis(0) : left;
}

inline std::string RankWord(const std::vector<int>& ranks) { return ranks.size() == 1 ? "rank" : "ranks"; }

// "3" / "1, 3" / "1, 2, 3, 4, 5, 6, 7, 8 and 12 more".
inline std::string JoinRanks(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) s += " and " + std::to_string(ranks.size() - kShown) + " more";
  return s;
}

// Gloo prefixes its messages with "[/path/to/gloo/file.cc:123] "; the source location helps nobody reading ours.
inline std::string CleanGlooMessage(std::string msg) {
  while (!msg.empty() && msg[0] == '[') {
    size_t end = msg.find("] ");
    if (end == std::string::npos || msg.find(':') > end) break;
    msg.erase(0, end + 2);
  }
  return msg;
}

template <typename F>
bool CatchGloo(F&& f, std::string* error) {
  try {
    f();
    return true;
  } catch (const gloo::EnforceNotMet& e) {
    *error = CleanGlooMessage(e.what());
  } catch (const std::bad_alloc&) {
    throw;  // Reported as kNoMemory by the caller.
  } catch (const std::exception& e) {
    *error = CleanGlooMessage(e.what());
  } catch (...) {
    *error = "unknown exception from Gloo";
  }
  return false;
}

}  // namespace internal_gloo
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_UTIL_H_
