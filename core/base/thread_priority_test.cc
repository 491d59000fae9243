#include "core/base/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

#include "gtest/gtest.h"

namespace distckpt {
namespace {

struct Seen {
  int nice = 0, policy = 0, ioprio = 0;
};

// What the kernel says of the calling thread.
Seen Look() {
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  Seen s;
  errno = 0;
  s.nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  s.policy = sched_getscheduler(tid);
  s.ioprio = static_cast<int>(syscall(SYS_ioprio_get, 1, tid));
  return s;
}

// Each case runs on a thread of its own (the priority cannot be raised back), and a thread that thread starts.
void InThread(ThreadPriority p, Seen* self, Seen* child, Status* st) {
  std::thread([&] {
    *st = SetThisThreadPriority(p);
    *self = Look();
    std::thread([&] { *child = Look(); }).join();
  }).join();
}

TEST(ThreadPriority, LowIsNice19AndBestEffortLevel7AndIsInherited) {
  const Seen before = Look();
  Seen self, child;
  Status st;
  InThread(ThreadPriority::kLow, &self, &child, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const Seen& s : {self, child}) {
    EXPECT_EQ(s.nice, 19);
    EXPECT_EQ(s.policy, SCHED_OTHER);
    EXPECT_EQ(s.ioprio, (2 << 13) | 7);
  }
  // The thread that asked is the only one changed.
  EXPECT_EQ(Look().nice, before.nice);
}

TEST(ThreadPriority, IdleIsSchedIdleAndTheIdleIoClassAndIsInherited) {
  Seen self, child;
  Status st;
  InThread(ThreadPriority::kIdle, &self, &child, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const Seen& s : {self, child}) {
    EXPECT_EQ(s.policy, SCHED_IDLE);
    EXPECT_EQ(s.ioprio >> 13, 3);
  }
  EXPECT_EQ(Look().policy, SCHED_OTHER);
}

TEST(ThreadPriority, NormalChangesNothing) {
  Seen before = Look(), self, child;
  Status st;
  InThread(ThreadPriority::kNormal, &self, &child, &st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(self.nice, before.nice);
  EXPECT_EQ(self.policy, before.policy);
  EXPECT_EQ(self.ioprio, before.ioprio);
}

}  // namespace
}  // namespace distckpt
