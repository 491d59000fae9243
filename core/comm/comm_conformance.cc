#include "core/comm/comm_conformance.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <thread>

namespace distckpt {
namespace comm_testing {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Deterministic contents that differ per rank, per round and per byte, so a misplaced or stale message shows.
std::string Payload(int rank, int round, size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>((rank * 131 + round * 31 + i * 7 + (i >> 8)) & 0xff);
  return s;
}

std::string Summary(const std::string& s) {
  return std::to_string(s.size()) + " bytes" + (s.empty() ? "" : " starting 0x" + [&] {
           char buf[3];
           std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(s[0]));
           return std::string(buf);
         }());
}

class Checker {
 public:
  Checker(Communicator* comm, const ConformanceOptions& o) : c_(comm), o_(o), me_(comm->rank()), n_(comm->size()) {}

  Status Run() {
    DCKPT_RETURN_IF_ERROR(Identity());
    DCKPT_RETURN_IF_ERROR(AllGathers());
    DCKPT_RETURN_IF_ERROR(Gathers());
    DCKPT_RETURN_IF_ERROR(Broadcasts());
    DCKPT_RETURN_IF_ERROR(Barriers());
    DCKPT_RETURN_IF_ERROR(InvalidRoots());
    DCKPT_RETURN_IF_ERROR(ManySmall());
    DCKPT_RETURN_IF_ERROR(SendRecvs());
    if (o_.check_timeout && n_ > 1) DCKPT_RETURN_IF_ERROR(Timeout());
    return OkStatus();
  }

 private:
  Status Fail(const std::string& check, const std::string& what) const {
    return Internal("conformance check '" + check + "' failed on rank " + std::to_string(me_) + " of " +
                    std::to_string(n_) + " (" + c_->name() + "): " + what);
  }
  Status Failed(const std::string& check, const Status& st) const {
    return Status(st.code(), "conformance check '" + check + "' failed on rank " + std::to_string(me_) + " of " +
                                 std::to_string(n_) + " (" + c_->name() + "): " + st.message());
  }

  // Point-to-point: each rank sends to the next and receives from the one before (a ring), with sizes varied and one
  // large; then only rank 0 sends (to every other rank) and only the others receive; buffers are reused across
  // rounds. With one rank there is nobody to send to: an empty call.
  Status SendRecvs() {
    std::string in;
    for (int round = 0; round < 3; ++round) {
      if (n_ == 1) {
        Status st = c_->SendRecv({}, {}, o_.timeout);
        if (!st.ok()) return Failed("sendrecv", st);
        continue;
      }
      const int next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
      auto message = [&](int from) {
        const size_t size =
            round == 2 && from == n_ - 1 ? o_.large_bytes : static_cast<size_t>((from * 7 + round) % 13);
        std::string m(size, '\0');
        for (size_t i = 0; i < size; ++i) m[i] = static_cast<char>(from * 31 + round * 7 + i);
        return m;
      };
      const std::string out = message(me_);
      Status st = c_->SendRecv({{next, out}}, {{prev, &in}}, o_.timeout);
      if (!st.ok()) return Failed("sendrecv", st);
      if (in != message(prev)) {
        return Fail("sendrecv", "round " + std::to_string(round) + ": " + std::to_string(in.size()) +
                                    " bytes from rank " + std::to_string(prev) + ", not its message of " +
                                    std::to_string(message(prev).size()));
      }
    }
    if (n_ > 1) {
      std::vector<std::string> outs(n_);
      std::vector<std::pair<int, std::string_view>> sends;
      std::vector<std::pair<int, std::string*>> recvs;
      if (me_ == 0) {
        for (int r = 1; r < n_; ++r) {
          outs[r] = "to rank " + std::to_string(r);
          sends.emplace_back(r, outs[r]);
        }
      } else {
        recvs.emplace_back(0, &in);
      }
      Status st = c_->SendRecv(sends, recvs, o_.timeout);
      if (!st.ok()) return Failed("sendrecv", st);
      if (me_ != 0 && in != "to rank " + std::to_string(me_)) return Fail("sendrecv", "from rank 0: '" + in + "'");
    }
    return SendRecvsInto();
  }

  // SendRecvInto: a ring of messages of known sizes (one large) received into place, the bytes around each target
  // left alone. (A message of the wrong size fails the call, and a Gloo group with it: gloo_failure_test.)
  Status SendRecvsInto() {
    if (n_ == 1) return c_->SendRecvInto({}, {}, o_.timeout).WithContext("sendrecv_into alone");
    const int next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
    auto message = [&](int from) {
      std::string m(from == n_ - 1 ? o_.large_bytes : static_cast<size_t>(from * 5 + 3), '\0');
      for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<char>(from * 17 + i * 3);
      return m;
    };
    const std::string out = message(me_), want = message(prev);
    std::string target(want.size() + 2, '#');
    Status st = c_->SendRecvInto({{next, out}}, {{prev, &target[1], want.size()}}, o_.timeout);
    if (!st.ok()) return Failed("sendrecv_into", st);
    if (target != "#" + want + "#")
      return Fail("sendrecv_into", "the bytes from rank " + std::to_string(prev) + " are not its message, in place");
    return SeveralInto();
  }

  // SendRecvInto with several messages to one peer (one of them empty, one large): each lands in its own place, the
  // k-th send matched with the peer's k-th receive; and the ring's other way at once (two peers, several each).
  Status SeveralInto() {
    const int next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
    auto message = [&](int from, int to, int k) {
      const size_t len = k == 1 ? 0 : k == 2 ? o_.large_bytes : static_cast<size_t>(from * 7 + to * 3 + k + 1);
      std::string m(len, '\0');
      for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<char>(from * 31 + to * 7 + k * 13 + i);
      return m;
    };
    constexpr int kMessages = 4;
    std::vector<std::string> out;  // to next, then (n > 2) to prev
    std::vector<std::pair<int, std::string_view>> sends;
    std::vector<std::string> want, target;
    std::vector<Communicator::RecvInto> recvs;
    const std::vector<int> peers = n_ > 2 ? std::vector<int>{next, prev} : std::vector<int>{next};
    out.reserve(peers.size() * kMessages);
    for (int to : peers) {
      for (int k = 0; k < kMessages; ++k) out.push_back(message(me_, to, k));
    }
    for (size_t i = 0; i < out.size(); ++i) sends.emplace_back(peers[i / kMessages], out[i]);
    // From prev (it sends to its next, us) and, with more than two ranks, from next (its prev is us).
    const std::vector<int> from = n_ > 2 ? std::vector<int>{prev, next} : std::vector<int>{prev};
    for (int f : from) {
      for (int k = 0; k < kMessages; ++k) want.push_back(message(f, me_, k));
    }
    target.reserve(want.size());
    for (const std::string& w : want) target.push_back(std::string(w.size() + 2, '#'));
    for (size_t i = 0; i < want.size(); ++i) recvs.push_back({from[i / kMessages], &target[i][1], want[i].size()});
    // Interleave the sends of the two peers: the order that matters is per peer.
    if (peers.size() == 2) {
      std::vector<std::pair<int, std::string_view>> mixed;
      for (int k = 0; k < kMessages; ++k) {
        mixed.push_back(sends[k]);
        mixed.push_back(sends[kMessages + k]);
      }
      sends = mixed;
    }
    Status st = c_->SendRecvInto(sends, recvs, o_.timeout);
    if (!st.ok()) return Failed("sendrecv_into (several to one peer)", st);
    for (size_t i = 0; i < want.size(); ++i) {
      if (target[i] != "#" + want[i] + "#") {
        return Fail("sendrecv_into (several to one peer)", "message " + std::to_string(i % kMessages) + " from rank " +
                                                               std::to_string(from[i / kMessages]) +
                                                               " is not in its place");
      }
    }
    return OkStatus();
  }

  Status Identity() {
    if (n_ < 1 || me_ < 0 || me_ >= n_) {
      return Fail("identity", "rank " + std::to_string(me_) + " / size " + std::to_string(n_) + " out of range");
    }
    if (c_->name().empty()) return Fail("identity", "empty backend name");
    std::vector<std::string> all;
    const std::string mine = "rank=" + std::to_string(me_) + " size=" + std::to_string(n_);
    Status st = c_->AllGather(mine, &all, o_.timeout);
    if (!st.ok()) return Failed("identity", st);
    if (static_cast<int>(all.size()) != n_) return Fail("identity", "allgather returned " + std::to_string(all.size()));
    for (int r = 0; r < n_; ++r) {
      const std::string want = "rank=" + std::to_string(r) + " size=" + std::to_string(n_);
      if (all[r] != want) return Fail("identity", "slot " + std::to_string(r) + " holds '" + all[r] + "'");
    }
    return OkStatus();
  }

  // Sizes per rank for a variant: 0 = varied including empty, 1 = all empty, 2 = one large contribution.
  size_t SizeOf(int rank, int variant) const {
    switch (variant) {
      case 0:
        return static_cast<size_t>(rank * 37 % 101);  // rank 0 contributes nothing
      case 1:
        return 0;
      default:
        return rank == n_ - 1 ? o_.large_bytes : static_cast<size_t>(rank + 1);
    }
  }

  Status CheckAll(const std::string& check, const std::vector<std::string>& all, int round, int variant) const {
    if (static_cast<int>(all.size()) != n_) {
      return Fail(check, "got " + std::to_string(all.size()) + " contributions, want " + std::to_string(n_));
    }
    for (int r = 0; r < n_; ++r) {
      if (all[r] != Payload(r, round, SizeOf(r, variant))) {
        return Fail(check, "contribution of rank " + std::to_string(r) + " is wrong: " + Summary(all[r]) + ", want " +
                               Summary(Payload(r, round, SizeOf(r, variant))));
      }
    }
    return OkStatus();
  }

  Status AllGathers() {
    for (int variant = 0; variant < 3; ++variant) {
      const std::string check = "allgather variant " + std::to_string(variant);
      const int round = 10 + variant;
      std::vector<std::string> all{"stale"};
      Status st = c_->AllGather(Payload(me_, round, SizeOf(me_, variant)), &all, o_.timeout);
      if (!st.ok()) return Failed(check, st);
      DCKPT_RETURN_IF_ERROR(CheckAll(check, all, round, variant));
    }
    return OkStatus();
  }

  Status Gathers() {
    const int roots[] = {0, n_ - 1};
    for (int i = 0; i < 2; ++i) {
      const int root = roots[i];
      for (int variant = 0; variant < 3; variant += 2) {
        const std::string check = "gather to rank " + std::to_string(root) + " variant " + std::to_string(variant);
        const int round = 20 + i * 3 + variant;
        std::vector<std::string> all{"stale"};
        Status st = c_->Gather(Payload(me_, round, SizeOf(me_, variant)), root, &all, o_.timeout);
        if (!st.ok()) return Failed(check, st);
        if (me_ == root) {
          DCKPT_RETURN_IF_ERROR(CheckAll(check, all, round, variant));
        } else if (!all.empty()) {
          return Fail(check, "a non-root got " + std::to_string(all.size()) + " contributions, want none");
        }
      }
    }
    return OkStatus();
  }

  Status Broadcasts() {
    const size_t sizes[] = {0, 17, o_.large_bytes};
    for (int root = 0; root < n_; ++root) {
      for (size_t size : sizes) {
        const std::string check = "broadcast of " + std::to_string(size) + " bytes from rank " + std::to_string(root);
        const int round = 40 + root;
        const std::string want = Payload(root, round, size);
        // Non-roots start with different contents and a different size: all of it must be replaced.
        std::string data = me_ == root ? want : "garbage of another size " + std::to_string(me_);
        Status st = c_->Broadcast(&data, root, o_.timeout);
        if (!st.ok()) return Failed(check, st);
        if (data != want) return Fail(check, "got " + Summary(data) + ", want " + Summary(want));
      }
    }
    return OkStatus();
  }

  Status Barriers() {
    for (int i = 0; i < 3; ++i) {
      Status st = c_->Barrier(o_.timeout);
      if (!st.ok()) return Failed("barrier", st);
    }
    return OkStatus();
  }

  // Every rank passes the same bad root, so every rank fails locally and the group stays usable.
  Status InvalidRoots() {
    std::vector<std::string> all;
    Status st = c_->Gather("x", n_, &all, o_.timeout);
    if (st.code() != StatusCode::kInvalidArgument) {
      return Fail("invalid root", "gather to rank " + std::to_string(n_) + " returned " + st.ToString());
    }
    std::string data = "x";
    st = c_->Broadcast(&data, -1, o_.timeout);
    if (st.code() != StatusCode::kInvalidArgument) {
      return Fail("invalid root", "broadcast from rank -1 returned " + st.ToString());
    }
    st = c_->Barrier(o_.timeout);
    if (!st.ok()) return Failed("barrier after invalid roots", st);
    return OkStatus();
  }

  Status ManySmall() {
    for (int i = 0; i < o_.repetitions; ++i) {
      const std::string check = "small collective #" + std::to_string(i);
      const int round = 100 + i;
      const size_t size = static_cast<size_t>(i % 9);
      Status st;
      switch (i % 4) {
        case 0: {
          std::vector<std::string> all;
          st = c_->AllGather(Payload(me_, round, size + me_), &all, o_.timeout);
          if (st.ok()) {
            for (int r = 0; r < n_ && st.ok(); ++r) {
              if (all.size() != static_cast<size_t>(n_) || all[r] != Payload(r, round, size + r)) {
                return Fail(check, "allgather: wrong contribution of rank " + std::to_string(r));
              }
            }
          }
          break;
        }
        case 1: {
          const int root = i % n_;
          std::string data = me_ == root ? Payload(root, round, size) : std::string();
          st = c_->Broadcast(&data, root, o_.timeout);
          if (st.ok() && data != Payload(root, round, size)) return Fail(check, "broadcast: wrong data");
          break;
        }
        case 2: {
          const int root = (i / 4) % n_;
          std::vector<std::string> all;
          st = c_->Gather(Payload(me_, round, size), root, &all, o_.timeout);
          if (st.ok() && me_ == root) {
            for (int r = 0; r < n_; ++r) {
              if (all.size() != static_cast<size_t>(n_) || all[r] != Payload(r, round, size)) {
                return Fail(check, "gather: wrong contribution of rank " + std::to_string(r));
              }
            }
          }
          break;
        }
        default:
          st = c_->Barrier(o_.timeout);
      }
      if (!st.ok()) return Failed(check, st);
    }
    return OkStatus();
  }

  Status Timeout() {
    const std::string check = "timeout";
    if (me_ == n_ - 1) {
      // Absent: sit out the barrier the others are in, then leave without another call.
      std::this_thread::sleep_for(o_.short_timeout * 2 + Millis(500));
      return OkStatus();
    }
    const auto start = Clock::now();
    Status st = c_->Barrier(o_.short_timeout);
    const auto took = std::chrono::duration_cast<Millis>(Clock::now() - start);
    if (st.ok()) return Fail(check, "a barrier with rank " + std::to_string(n_ - 1) + " absent succeeded");
    if (took > o_.short_timeout + o_.slack) {
      return Fail(check, "the barrier failed only after " + std::to_string(took.count()) + " ms with a timeout of " +
                             std::to_string(o_.short_timeout.count()) + " ms: " + st.ToString());
    }
    std::fprintf(stderr, "[rank %d] expected failure after %lld ms: %s\n", me_, static_cast<long long>(took.count()),
                 st.ToString().c_str());
    const auto again = Clock::now();
    Status later = c_->Barrier(o_.timeout);
    const auto took_again = std::chrono::duration_cast<Millis>(Clock::now() - again);
    if (later.code() != StatusCode::kState || took_again > Millis(100)) {
      return Fail(check, "a call after the failure returned " + later.ToString() + " after " +
                             std::to_string(took_again.count()) + " ms; want kState at once");
    }
    return OkStatus();
  }

  Communicator* c_;
  const ConformanceOptions& o_;
  const int me_;
  const int n_;
};

}  // namespace

Status RunConformance(Communicator* comm, const ConformanceOptions& options) {
  try {
    return Checker(comm, options).Run();
  } catch (const std::exception& e) {
    return Internal(std::string("conformance: exception escaped the communicator: ") + e.what());
  } catch (...) {
    return Internal("conformance: unknown exception escaped the communicator");
  }
}

std::vector<RankOutcome> RunRanks(int n, std::chrono::seconds limit, const std::function<int(int)>& body,
                                  const std::vector<int>& may_linger) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<RankOutcome> outcomes(n);
  std::vector<pid_t> pids(n, -1);
  const auto start = Clock::now();
  for (int r = 0; r < n; ++r) {
    outcomes[r].rank = r;
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      std::abort();
    }
    if (pid == 0) {
      alarm(static_cast<unsigned>(limit.count()));
      int code = 3;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "[rank %d] unknown exception\n", r);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids[r] = pid;
  }
  auto lingering = [&](int r) {
    for (int m : may_linger) {
      if (m == r) return true;
    }
    return false;
  };
  int remaining = n;
  while (remaining > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] != pid) continue;
        RankOutcome& o = outcomes[r];
        o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
        pids[r] = -1;
        --remaining;
      }
      continue;
    }
    // Nobody exited just now. Kill lingering ranks once the others are done, and everyone past the backstop.
    bool others_done = true;
    for (int r = 0; r < n; ++r) {
      if (pids[r] > 0 && !lingering(r)) others_done = false;
    }
    const bool overdue = Clock::now() - start > limit + std::chrono::seconds(5);
    for (int r = 0; r < n; ++r) {
      if (pids[r] > 0 && (overdue || (others_done && lingering(r)))) {
        if (!outcomes[r].killed_by_harness) kill(pids[r], SIGKILL);
        outcomes[r].killed_by_harness = true;
      }
    }
    std::this_thread::sleep_for(Millis(10));
  }
  return outcomes;
}

int ReportInChild(int rank, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "[rank %d] %s\n", rank, status.ToString().c_str());
  return 1;
}

bool AllExitedZero(const std::vector<RankOutcome>& outcomes) {
  for (const RankOutcome& o : outcomes) {
    if (o.exit_code != 0) return false;
  }
  return true;
}

std::string Describe(const std::vector<RankOutcome>& outcomes) {
  std::string s;
  for (const RankOutcome& o : outcomes) {
    s += "rank " + std::to_string(o.rank) + ": ";
    if (o.exit_code >= 0) {
      s += "exit " + std::to_string(o.exit_code);
    } else {
      s += "signal " + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")";
    }
    if (o.killed_by_harness) s += ", killed by the harness";
    char t[32];
    std::snprintf(t, sizeof(t), " after %.2f s\n", o.seconds);
    s += t;
  }
  return s;
}

}  // namespace comm_testing
}  // namespace distckpt
