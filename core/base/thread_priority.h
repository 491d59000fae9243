// The CPU and I/O priority of the calling thread, for background work that must leave the foreground alone (the
// checkpoint manager's writes, replication and persisting beside a training loop).
#ifndef DISTCKPT_CORE_BASE_THREAD_PRIORITY_H_
#define DISTCKPT_CORE_BASE_THREAD_PRIORITY_H_

#include "core/base/status.h"

namespace distckpt {

enum class ThreadPriority {
  kNormal = 0,  ///< as the thread that started it: nothing is changed
  kLow = 1,   ///< nice 19 and I/O priority best-effort 7: runs whenever it can, but loses every contended CPU and disk
  kIdle = 2,  ///< SCHED_IDLE and the idle I/O class: runs only on a CPU (disk) nothing else wants
};

/// Sets the calling thread's priority (Linux sets both per thread; threads it starts afterwards inherit them). Only
/// ever lowers, so no privilege is needed. Returns the first failure naming the system call; the thread keeps what
/// could be set. Elsewhere than Linux: kUnsupported for anything but kNormal.
Status SetThisThreadPriority(ThreadPriority priority);

/// "normal", "low", "idle".
const char* ThreadPriorityName(ThreadPriority priority);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_THREAD_PRIORITY_H_
