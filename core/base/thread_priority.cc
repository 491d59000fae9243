#include "core/base/thread_priority.h"

#include <cerrno>

#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace distckpt {

#if defined(__linux__)
namespace {

// linux/ioprio.h is not in every libc's headers: its few constants, which are ABI.
constexpr int kIoprioWhoProcess = 1;  // a thread id, for ioprio_set
constexpr int kIoprioClassShift = 13;
constexpr int kIoprioClassBestEffort = 2;
constexpr int kIoprioClassIdle = 3;

Status SetIoPriority(pid_t tid, int io_class, int level) {
  if (syscall(SYS_ioprio_set, kIoprioWhoProcess, tid, (io_class << kIoprioClassShift) | level) != 0) {
    return ErrnoError(errno, "ioprio_set(class " + std::to_string(io_class) + ", level " + std::to_string(level) +
                                 ") of thread " + std::to_string(tid));
  }
  return OkStatus();
}

}  // namespace

Status SetThisThreadPriority(ThreadPriority priority) {
  if (priority == ThreadPriority::kNormal) return OkStatus();
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  Status st;
  if (priority == ThreadPriority::kLow) {
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19) != 0) {
      st = ErrnoError(errno, "setpriority(nice 19) of thread " + std::to_string(tid));
    }
    Status io = SetIoPriority(tid, kIoprioClassBestEffort, 7);
    return st.ok() ? io : st;
  }
  sched_param param{};
  param.sched_priority = 0;
  if (sched_setscheduler(tid, SCHED_IDLE, &param) != 0) {
    st = ErrnoError(errno, "sched_setscheduler(SCHED_IDLE) of thread " + std::to_string(tid));
  }
  Status io = SetIoPriority(tid, kIoprioClassIdle, 0);
  return st.ok() ? io : st;
}

#else

Status SetThisThreadPriority(ThreadPriority priority) {
  if (priority == ThreadPriority::kNormal) return OkStatus();
  return Unsupported("lowering a thread's priority is implemented for Linux only");
}

#endif

const char* ThreadPriorityName(ThreadPriority priority) {
  switch (priority) {
    case ThreadPriority::kNormal:
      return "normal";
    case ThreadPriority::kLow:
      return "low";
    case ThreadPriority::kIdle:
      return "idle";
  }
  return "?";
}

}  // namespace distckpt
