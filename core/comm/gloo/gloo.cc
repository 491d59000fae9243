#include "core/comm/gloo/gloo.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/wire.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "core/comm/collective_call.h"

namespace distckpt {
namespace internal_gloo {
namespace {

using internal_comm::Call;
using internal_comm::Clock;
using internal_comm::Millis;
using internal_comm::Op;
using internal_comm::OpName;
using gloo::transport::UnboundBuffer;

// ---------------------------------------------------------------------------------------------------------------
// Small helpers.

long long CountMs(Millis d) { return static_cast<long long>(d.count()); }

Millis Until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return left.count() < 0 ? Millis(0) : left;
}

std::string RankWord(const std::vector<int>& ranks) { return ranks.size() == 1 ? "rank" : "ranks"; }

// "3" / "1, 3" / "1, 2, 3, 4, 5, 6, 7, 8 and 12 more".
std::string JoinRanks(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) s += " and " + std::to_string(ranks.size() - kShown) + " more";
  return s;
}

// Gloo prefixes its messages with "[/path/to/gloo/file.cc:123] "; the source location helps nobody reading ours.
std::string CleanGlooMessage(std::string msg) {
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

// ---------------------------------------------------------------------------------------------------------------
// SIGPIPE. Gloo writes to sockets with writev(2), which raises SIGPIPE when the peer has died, and SIGPIPE kills the
// process by default. Blocking it in every thread that writes (the caller during a collective, and Gloo's event loop
// thread, which inherits the mask of the thread that creates the device) turns it into EPIPE, which Gloo reports as
// a closed connection. Blocking, unlike ignoring, leaves the application's own disposition alone. A SIGPIPE raised
// while blocked is pending on this thread; it is consumed before the old mask returns so it is never delivered late.
class SigpipeBlocker {
 public:
  SigpipeBlocker() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlocker() {
    const int saved_errno = errno;
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved_errno;
  }
  SigpipeBlocker(const SigpipeBlocker&) = delete;
  SigpipeBlocker& operator=(const SigpipeBlocker&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// Watchdog. Gloo's own wait timeout closes every connection of the group at once, which would stop this rank from
// forwarding the failure to the ranks below it in a broadcast tree and make them blame this rank instead of the one
// that stalled. The watchdog instead interrupts the single wait in progress (abortWaitRecv/abortWaitSend) when its
// deadline passes and leaves the connections open; the communicator closes them itself once it has reported.
class Watchdog {
 public:
  Watchdog() : thread_([this] { Loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Interrupts the wait on `buf` (a recv wait if `recv`, else a send wait) at `deadline` unless Disarm() comes first.
  void Arm(UnboundBuffer* buf, bool recv, Clock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      buf_ = buf;
      recv_ = recv;
      deadline_ = deadline;
      fired_ = false;
    }
    cv_.notify_one();
  }
  /// Returns whether the watchdog interrupted the wait. After this returns the buffer may be destroyed.
  bool Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    buf_ = nullptr;
    return fired_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (buf_ == nullptr || fired_) {
        cv_.wait(lock);
      } else if (Clock::now() >= deadline_) {
        fired_ = true;
        // Under mu_: Disarm() cannot return, so the buffer cannot be destroyed, until this call is done. The lock
        // order is always mu_ then the buffer's own mutex; the waiting thread never holds both.
        if (recv_) {
          buf_->abortWaitRecv();
        } else {
          buf_->abortWaitSend();
        }
      } else {
        cv_.wait_until(lock, deadline_);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  UnboundBuffer* buf_ = nullptr;
  bool recv_ = false;
  Clock::time_point deadline_;
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_;  // Last: starts after the members it uses are constructed.
};

// ---------------------------------------------------------------------------------------------------------------
// Messages. Each one is a fixed header, then `size` payload bytes on the next slot. The header lets a rank notice
// that a peer called a different collective, and carries the size so the payload can be received exactly.
constexpr uint32_t kMagic = 0x474b4344;  // "DCKG"
constexpr uint32_t kFlagAbort = 1;       // The payload is an upstream rank's error message, not data.

struct Header {
  uint32_t magic = 0;
  uint32_t op = 0;
  int32_t root = -1;
  uint32_t flags = 0;
  uint64_t seq = 0;
  uint64_t size = 0;
};
static_assert(sizeof(Header) == 32, "the header is sent as raw bytes");

// Each collective uses its own two slots, derived from a counter every rank advances identically, so messages of
// different collectives can never be confused and slots are never reused.
uint64_t HeaderSlot(uint64_t seq) { return seq << 1; }
uint64_t PayloadSlot(uint64_t seq) { return (seq << 1) | 1; }
// Never sent to: a receive posted on it stays queued until its connection fails (see Group::PeerFailed).
constexpr uint64_t kSentinelSlot = ~uint64_t{0};
// How often a wait checks whether its peer's connection has failed underneath it.
constexpr Millis kHealthInterval(100);

/// What the collectives share: the connected transport context and the watchdog.
struct Group {
  int rank = 0;
  int size = 1;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::transport::Context> context;
  // One receive per peer on kSentinelSlot, posted once and never matched (see PeerFailed).
  std::vector<char> sentinel_bytes;
  std::vector<std::unique_ptr<UnboundBuffer>> sentinels;
  Watchdog watchdog;

  std::string Who() const { return "rank " + std::to_string(rank) + " of " + std::to_string(size); }

  void PostSentinels() {
    sentinel_bytes.assign(size, 0);
    sentinels.resize(size);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      // A connection that already failed leaves its sentinel out; the first barrier reports that peer anyway.
      std::string ignored;
      CatchGloo(
          [&] {
            auto buf = context->createUnboundBuffer(&sentinel_bytes[p], 1);
            buf->recv(p, kSentinelSlot);
            sentinels[p] = std::move(buf);
          },
          &ignored);
    }
  }

  // Whether the connection to `peer` has failed; if so, *error says how. Gloo (this version) tells a buffer that
  // its connection failed only while the buffer's operation is still queued: a transfer whose bytes are already
  // moving (the receive being read, a send partly written) is never told and would wait out its whole timeout. The
  // sentinel receive stays queued forever, so it is told; a wait on it interrupted at once by the watchdog rethrows
  // the failure if there is one and otherwise returns false without side effects.
  bool PeerFailed(int peer, std::string* error) {
    if (peer < 0 || peer >= static_cast<int>(sentinels.size()) || !sentinels[peer]) return false;
    UnboundBuffer* s = sentinels[peer].get();
    watchdog.Arm(s, /*recv=*/true, Clock::now());
    const bool threw = !CatchGloo([&] { s->waitRecv(nullptr, Millis(60000)); }, error);
    watchdog.Disarm();
    return threw;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Exchange: the point-to-point operations of one collective on one rank, and the bookkeeping that turns their
// failures into one Status naming the ranks at fault. Every operation is tied to a peer, so whichever wait times out
// or throws, we know which rank we were waiting for. Buffers destroyed with an operation still pending are dropped
// by Gloo (its pairs hold weak references); the communicator closes its connections first whenever that can happen.
class Exchange {
 public:
  Exchange(Group& group, const Call& call) : g_(group), call_(call), peers_(group.size) {}

  /// Adds a note shown after `peer` in errors, e.g. "relaying the broadcast from rank 3".
  void SetNote(int peer, std::string note) { peers_[peer].note = std::move(note); }

  /// Sends a header and `payload` to `peer`. `payload` must outlive Finish(). `deadline` bounds the wait for the
  /// send to complete (default: the collective's).
  void PostSend(int peer, const std::string& payload, uint32_t flags = 0,
                Clock::time_point deadline = Clock::time_point::max()) {
    Peer& p = peers_[peer];
    p.out_hdr.magic = kMagic;
    p.out_hdr.op = static_cast<uint32_t>(call_.op);
    p.out_hdr.root = call_.root;
    p.out_hdr.flags = flags;
    p.out_hdr.seq = call_.seq;
    p.out_hdr.size = payload.size();
    p.send_deadline = deadline == Clock::time_point::max() ? call_.deadline : deadline;
    p.sending = true;
    p.forward = (flags & kFlagAbort) != 0;
    std::string error;
    bool ok = CatchGloo(
        [&] {
          p.out_hdr_buf = g_.context->createUnboundBuffer(&p.out_hdr, sizeof(Header));
          p.out_hdr_buf->send(peer, HeaderSlot(call_.seq));
          if (!payload.empty()) {
            // Gloo only reads from a buffer it sends.
            p.out_data_buf = g_.context->createUnboundBuffer(const_cast<char*>(payload.data()), payload.size());
            p.out_data_buf->send(peer, PayloadSlot(call_.seq));
          }
        },
        &error);
    if (!ok) RecordFailure(peer, Outcome::kFailed, error, /*arrival=*/false);
  }

  /// Posts the receive of `peer`'s header. Post every receive before waiting on any, so peers never wait on us.
  void PostHeaderRecv(int peer) {
    Peer& p = peers_[peer];
    std::string error;
    bool ok = CatchGloo(
        [&] {
          p.in_hdr_buf = g_.context->createUnboundBuffer(&p.in_hdr, sizeof(Header));
          p.in_hdr_buf->recv(peer, HeaderSlot(call_.seq));
        },
        &error);
    if (!ok) RecordFailure(peer, Outcome::kFailed, error, /*arrival=*/true);
  }

  /// Waits (until `deadline`, default the collective's) for `peer`'s header, checks it and posts the receive of its
  /// payload into *out. Returns false if that failed (the failure is recorded).
  bool AwaitHeader(int peer, std::string* out, Clock::time_point deadline = Clock::time_point::max()) {
    Peer& p = peers_[peer];
    if (p.failed || !p.in_hdr_buf) return false;
    std::string error;
    Outcome o = Wait(p.in_hdr_buf.get(), /*recv=*/true, peer, Deadline(deadline), &error);
    if (o != Outcome::kDone) {
      RecordFailure(peer, o, error, /*arrival=*/true);
      return false;
    }
    const Header& h = p.in_hdr;
    if (h.magic != kMagic || h.op != static_cast<uint32_t>(call_.op) || h.root != call_.root || h.seq != call_.seq) {
      p.failed = true;
      if (mismatch_.empty()) {
        mismatch_ = "collective mismatch at " + call_.Describe() + ": this rank (" + g_.Who() + ") called " +
                    call_.Name() + " but rank " + std::to_string(peer) + " sent " +
                    (h.magic == kMagic ? OpName(h.op, h.root) + " #" + std::to_string(h.seq)
                                       : std::string("a message that is not from distckpt")) +
                    "; every rank must call the same collectives in the same order";
      }
      return false;
    }
    p.upstream_abort = (h.flags & kFlagAbort) != 0;
    std::string* dst = p.upstream_abort ? &p.abort_message : out;
    dst->assign(static_cast<size_t>(h.size), '\0');  // May throw bad_alloc: reported as kNoMemory.
    if (h.size > 0) {
      p.payload_pending = true;
      bool ok = CatchGloo(
          [&] {
            p.in_data_buf = g_.context->createUnboundBuffer(&(*dst)[0], dst->size());
            p.in_data_buf->recv(peer, PayloadSlot(call_.seq));
          },
          &error);
      if (!ok) {
        p.payload_pending = false;
        RecordFailure(peer, Outcome::kFailed, error, /*arrival=*/false);
        return false;
      }
    }
    if (p.upstream_abort) {
      AwaitPayload(peer, deadline);
      p.failed = true;
      upstream_.push_back({peer, p.abort_message});
      return false;
    }
    return true;
  }

  /// Waits for the payload announced by `peer`'s header. Returns false if it failed (the failure is recorded).
  bool AwaitPayload(int peer, Clock::time_point deadline = Clock::time_point::max()) {
    Peer& p = peers_[peer];
    if (!p.payload_pending) return !p.failed;
    p.payload_pending = false;
    std::string error;
    Outcome o = Wait(p.in_data_buf.get(), /*recv=*/true, peer, Deadline(deadline), &error);
    if (o != Outcome::kDone) {
      RecordFailure(peer, o, error, /*arrival=*/false);
      return false;
    }
    return true;
  }

  /// Waits for every receive and send still in flight, then reports the outcome of the whole collective.
  Status Finish() {
    for (int peer = 0; peer < g_.size; ++peer) AwaitPayload(peer);
    for (int peer = 0; peer < g_.size; ++peer) AwaitSend(peer);
    return Summary();
  }

  /// The collective's outcome so far: OK, or one error naming the ranks at fault.
  Status Summary() const {
    const std::string where = " on " + g_.Who();
    const std::string timeout = std::to_string(CountMs(call_.timeout)) + " ms";
    if (!mismatch_.empty()) return InvalidArgument("gloo: " + mismatch_);
    if (!upstream_.empty()) {
      const auto& u = upstream_.front();
      return Status(StatusCode::kPeer, "gloo: " + call_.Describe() + " failed" + where + " (timeout " + timeout +
                                           "): rank " + std::to_string(u.peer) + " forwarded: " + u.detail);
    }
    if (!timed_out_.empty()) {
      std::string who = RankWord(timed_out_) + " " + JoinRanks(timed_out_);
      if (timed_out_.size() == 1 && !peers_[timed_out_[0]].note.empty()) {
        who += " (" + peers_[timed_out_[0]].note + ")";
      }
      std::string msg = "gloo: " + call_.Describe() + " timed out after " + timeout + where + " waiting for " + who +
                        " (" + (timed_out_.size() == 1 ? "it" : "they") + " died, stalled or did not call " +
                        call_.Name() + ")";
      if (!lost_.empty()) msg += "; the connection to " + LostRanks() + " failed too: " + lost_.front().detail;
      return TimeoutError(msg);
    }
    if (!lost_.empty()) {
      const int first = lost_.front().peer;
      std::string note = peers_[first].note.empty() ? "" : " (" + peers_[first].note + ")";
      return Status(StatusCode::kPeer, "gloo: " + call_.Describe() + " failed" + where + " (timeout " + timeout +
                                           "): the connection to " + LostRanks() + note +
                                           " closed; it exited, crashed or gave up on the group: " +
                                           lost_.front().detail);
    }
    return OkStatus();
  }

 private:
  enum class Outcome { kDone, kTimedOut, kFailed };

  struct Peer {
    Header out_hdr;
    Header in_hdr;
    std::unique_ptr<UnboundBuffer> out_hdr_buf, out_data_buf, in_hdr_buf, in_data_buf;
    Clock::time_point send_deadline;
    std::string abort_message;
    std::string note;
    bool sending = false;
    bool forward = false;  // Sends an upstream error down a broadcast tree: best effort, waited for even after
                           // this rank gave up, and never blamed on the child.
    bool payload_pending = false;
    bool upstream_abort = false;
    bool failed = false;
  };
  struct Failure {
    int peer;
    std::string detail;
  };

  Clock::time_point Deadline(Clock::time_point requested) const {
    return requested == Clock::time_point::max() ? call_.deadline : requested;
  }

  // Waits for one operation with `peer`. Before this rank has given up, the wait runs in slices of
  // kHealthInterval, each ended by the watchdog, checking between slices that the peer's connection has not failed
  // underneath the transfer; at `deadline` it times out. After this rank gave up (or once the deadline has passed)
  // the wait only probes whether the operation already completed, with Gloo's own zero timeout; that closes this
  // rank's connections if it had not, which the failure path does anyway.
  // `force`: wait until `deadline` even after this rank gave up (forwarding an error), without giving up for it.
  Outcome Wait(UnboundBuffer* buf, bool recv, int peer, Clock::time_point deadline, std::string* error,
               bool force = false) {
    const bool probe = (gave_up_ && !force) || Clock::now() >= deadline;
    if (probe && !force) gave_up_ = true;
    auto wait = [&](Millis gloo_timeout, bool* done) {
      return CatchGloo(
          [&] { *done = recv ? buf->waitRecv(nullptr, gloo_timeout) : buf->waitSend(nullptr, gloo_timeout); }, error);
    };
    bool done = false;
    if (probe) return wait(Millis(0), &done) && done ? Outcome::kDone : Outcome::kTimedOut;
    for (;;) {
      g_.watchdog.Arm(buf, recv, std::min(deadline, Clock::now() + kHealthInterval));
      // Gloo's own timeout is only a backstop should the watchdog fail to fire.
      const bool threw = !wait(Until(deadline) + Millis(30000), &done);
      g_.watchdog.Disarm();
      if (!threw && done) return Outcome::kDone;
      if (threw) return error->find("Timed out") != std::string::npos ? GiveUp(force) : Outcome::kFailed;
      // Interrupted by the watchdog. An operation that completed at that instant stays completed: the next wait
      // returns at once.
      if (Clock::now() >= deadline) return GiveUp(force);
      if (g_.PeerFailed(peer, error)) return Outcome::kFailed;
    }
  }

  Outcome GiveUp(bool force) {
    if (!force) gave_up_ = true;
    return Outcome::kTimedOut;
  }

  // `arrival`: the operation was the receive of a peer's header, i.e. the sign that the peer reached the collective.
  void RecordFailure(int peer, Outcome o, const std::string& error, bool arrival) {
    Peer& p = peers_[peer];
    if (p.failed) return;
    p.failed = true;
    p.payload_pending = false;
    if (o == Outcome::kFailed && !gave_up_) {
      lost_.push_back({peer, error});
      return;
    }
    // Timed out, or failed after this rank gave up (its own probes close its connections): the peer had not done
    // its part by the deadline. The first such peer is the one this rank was waiting for. After that, only ranks
    // that never arrived are at fault; an unfinished transfer with a rank that did arrive is collateral.
    if (arrival || timed_out_.empty()) timed_out_.push_back(peer);
  }

  void AwaitSend(int peer) {
    Peer& p = peers_[peer];
    if (!p.sending || (p.failed && !p.forward)) return;
    p.sending = false;
    for (UnboundBuffer* buf : {p.out_hdr_buf.get(), p.out_data_buf.get()}) {
      if (buf == nullptr) continue;
      std::string error;
      Outcome o = Wait(buf, /*recv=*/false, peer, p.send_deadline, &error, /*force=*/p.forward);
      if (p.forward) {
        if (o != Outcome::kDone) return;
        continue;
      }
      if (o != Outcome::kDone) {
        RecordFailure(peer, o, error, /*arrival=*/false);
        return;
      }
    }
  }

  std::string LostRanks() const {
    std::vector<int> ranks;
    for (const auto& f : lost_) ranks.push_back(f.peer);
    return RankWord(ranks) + " " + JoinRanks(ranks);
  }

  Group& g_;
  const Call call_;
  std::vector<Peer> peers_;  // Indexed by rank; never resized, since Gloo holds pointers into it.
  bool gave_up_ = false;     // This rank's deadline passed.
  std::vector<int> timed_out_;
  std::vector<Failure> lost_;
  std::vector<Failure> upstream_;
  std::string mismatch_;
};

// ---------------------------------------------------------------------------------------------------------------
// The communicator.

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::transport::Context> context) {
    g_.rank = rank;
    g_.size = size;
    g_.device = std::move(device);
    g_.context = std::move(context);
    g_.PostSentinels();
  }

  ~GlooCommunicator() override {
    SigpipeBlocker sigpipe;
    CloseConnections();
    g_.sentinels.clear();
    g_.context.reset();
    g_.device.reset();  // Joins Gloo's event loop thread.
  }

  int rank() const override { return g_.rank; }
  int size() const override { return g_.size; }
  std::string name() const override { return "gloo"; }

  Status AllGather(const std::string& mine, std::vector<std::string>* all, Millis timeout) override {
    return AllGatherImpl(Op::kAllGather, mine, all, timeout);
  }

  Status Gather(const std::string& mine, int root, std::vector<std::string>* all, Millis timeout) override {
    all->clear();
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kGather, root, timeout, &call));
    const int n = g_.size, me = g_.rank;
    std::vector<std::string> out;
    Status st = Run(call, [&](Exchange& x) {
      if (me != root) {
        x.PostSend(root, mine);
        return;
      }
      out.resize(n);
      out[me] = mine;
      for (int p = 0; p < n; ++p) {
        if (p != me) x.PostHeaderRecv(p);
      }
      for (int p = 0; p < n; ++p) {
        if (p != me) x.AwaitHeader(p, &out[p]);
      }
    });
    if (st.ok() && me == root) *all = std::move(out);
    return st;
  }

  Status Broadcast(std::string* data, int root, Millis timeout) override {
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kBroadcast, root, timeout, &call));
    const int n = g_.size, me = g_.rank;
    // Binomial tree over virtual ranks (root = 0). A non-root's parent clears its lowest set bit; its children add
    // the powers of two below that bit.
    const int vr = (me - root + n) % n;
    const int lowbit = vr == 0 ? INT_MAX : (vr & -vr);
    const int parent = vr == 0 ? -1 : ((vr - lowbit) + root) % n;
    std::vector<int> children;
    for (long long m = 1; m < lowbit && vr + m < n; m <<= 1) children.push_back(static_cast<int>((vr + m + root) % n));
    std::reverse(children.begin(), children.end());  // Largest subtree first: the longest path starts earliest.
    int levels = 0;  // Depth of the whole tree.
    while ((1LL << levels) < n) ++levels;
    // A relay stops waiting for its parent a little before its own deadline, `height` steps of `step`, so that the
    // error it forwards reaches its subtree before those ranks time out and blame the relay.
    const Millis step = std::max(Millis(1), std::min(Millis(250), timeout / (4 * (levels + 1))));
    const int height = static_cast<int>(children.size());

    std::string received;   // A non-root's copy of the data, forwarded to its children.
    std::string forwarded;  // A relay's error, forwarded to its children instead.
    Status st = Run(call, [&](Exchange& x) {
      const std::string* payload = data;
      if (parent >= 0) {
        if (parent != root) x.SetNote(parent, "relaying the broadcast from rank " + std::to_string(root));
        x.PostHeaderRecv(parent);
        const Clock::time_point give_up = call.deadline - step * height;
        if (!x.AwaitHeader(parent, &received, give_up) || !x.AwaitPayload(parent, give_up)) {
          forwarded = x.Summary().message();
          // The forward gets its own short grace: the children are alive and waiting, so it completes in a round trip.
          const Clock::time_point grace = std::max(call.deadline, Clock::now() + Millis(500));
          for (int c : children) x.PostSend(c, forwarded, kFlagAbort, grace);
          return;
        }
        payload = &received;
      }
      for (int c : children) x.PostSend(c, *payload);
    });
    if (st.ok() && parent >= 0) *data = std::move(received);
    return st;
  }

  Status Barrier(Millis timeout) override { return AllGatherImpl(Op::kBarrier, std::string(), nullptr, timeout); }

 private:
  Status AllGatherImpl(Op op, const std::string& mine, std::vector<std::string>* all, Millis timeout) {
    if (all) all->clear();
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(op, -1, timeout, &call));
    const int n = g_.size, me = g_.rank;
    std::vector<std::string> out(n);
    Status st = Run(call, [&](Exchange& x) {
      // Sends in rotated order spread the first bytes across peers; receives are awaited in rank order.
      for (int k = 1; k < n; ++k) x.PostSend((me + k) % n, mine);
      for (int k = 1; k < n; ++k) x.PostHeaderRecv((me + k) % n);
      for (int p = 0; p < n; ++p) {
        if (p != me) x.AwaitHeader(p, &out[p]);
      }
    });
    if (st.ok() && all) {
      out[me] = mine;
      *all = std::move(out);
    }
    return st;
  }

  Status Begin(Op op, int root, Millis timeout, Call* call) {
    call->op = op;
    call->root = root;
    if (!broken_.ok()) {
      return Status(StatusCode::kState, "gloo: " + call->Name() + " on " + g_.Who() +
                                            " refused: the communicator is unusable after an earlier failure "
                                            "(create a new group): " +
                                            broken_.message());
    }
    if ((op == Op::kGather || op == Op::kBroadcast) && (root < 0 || root >= g_.size)) {
      return InvalidArgument("gloo: " + std::string(op == Op::kGather ? "gather" : "broadcast") + " root " +
                             std::to_string(root) + " is not a rank of this group of " + std::to_string(g_.size) +
                             " (on " + g_.Who() + ")");
    }
    call->seq = ++seq_;
    call->timeout = timeout.count() < 0 ? Millis(0) : timeout;
    call->deadline = Clock::now() + call->timeout;
    return OkStatus();
  }

  template <typename Body>
  Status Run(const Call& call, Body&& body) {
    SigpipeBlocker sigpipe;
    std::unique_ptr<Exchange> x;
    Status st;
    try {
      x = std::make_unique<Exchange>(g_, call);
      body(*x);
      st = x->Finish();
    } catch (const std::bad_alloc&) {
      st = Status(StatusCode::kNoMemory,
                  "gloo: " + call.Describe() + " on " + g_.Who() + ": out of memory for the messages");
    } catch (const std::exception& e) {
      st = Internal("gloo: " + call.Describe() + " on " + g_.Who() + ": " + CleanGlooMessage(e.what()));
    } catch (...) {
      st = Internal("gloo: " + call.Describe() + " on " + g_.Who() + ": unknown exception");
    }
    if (!st.ok()) {
      broken_ = st;
      // Peers still waiting on this rank now fail at once instead of waiting out their own timeouts. Closing
      // before the exchange's buffers are destroyed also retires whatever is still pending on them.
      CloseConnections();
    }
    x.reset();
    return st;
  }

  void Abort(const std::string& reason) override {
    if (broken_.ok()) broken_ = Status(StatusCode::kUser, "gloo: " + g_.Who() + " aborted: " + reason);
    CloseConnections();
  }

  void CloseConnections() {
    if (!g_.context) return;
    for (int p = 0; p < g_.size; ++p) {
      if (p == g_.rank) continue;
      std::string ignored;
      CatchGloo(
          [&] {
            auto& pair = g_.context->getPair(p);
            if (pair) pair->close();
          },
          &ignored);
    }
  }

  Group g_;
  uint64_t seq_ = 0;
  Status broken_;
};

// ---------------------------------------------------------------------------------------------------------------
// Rendezvous.

struct Target {
  enum Kind { kFile, kRedis } kind = kFile;
  std::string path;  // kFile
  std::string host;  // kRedis
  int port = 6379;   // kRedis
};

Result<Target> ParseRendezvous(const std::string& uri) {
  const std::string expected = "expected file:///shared/dir or redis://host:port";
  Target t;
  if (uri.rfind("file://", 0) == 0) {
    t.kind = Target::kFile;
    t.path = uri.substr(7);
    if (t.path.empty() || t.path[0] != '/') {
      return InvalidArgument("gloo: rendezvous '" + uri + "' must name an absolute directory (" + expected + ")");
    }
    return t;
  }
  if (uri.rfind("redis://", 0) == 0) {
    t.kind = Target::kRedis;
    std::string rest = uri.substr(8);
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::string port;
    if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
      size_t close = rest.find(']');
      if (close == std::string::npos) return InvalidArgument("gloo: rendezvous '" + uri + "': unclosed '['");
      t.host = rest.substr(1, close - 1);
      if (close + 1 < rest.size()) {
        if (rest[close + 1] != ':') return InvalidArgument("gloo: rendezvous '" + uri + "': " + expected);
        port = rest.substr(close + 2);
      }
    } else {
      size_t colon = rest.rfind(':');
      t.host = rest.substr(0, colon);
      if (colon != std::string::npos) port = rest.substr(colon + 1);
    }
    if (t.host.empty()) return InvalidArgument("gloo: rendezvous '" + uri + "' names no host (" + expected + ")");
    if (!port.empty()) {
      char* end = nullptr;
      errno = 0;
      long v = std::strtol(port.c_str(), &end, 10);
      if (errno != 0 || *end != '\0' || v < 1 || v > 65535) {
        return InvalidArgument("gloo: rendezvous '" + uri + "': port '" + port + "' is not in 1..65535");
      }
      t.port = static_cast<int>(v);
    }
    return t;
  }
  return InvalidArgument("gloo: unsupported rendezvous '" + uri + "' (" + expected + ")");
}

// The store operations the rendezvous needs. Gloo's stores throw; callers convert.
class Store {
 public:
  virtual ~Store() = default;
  virtual void Set(const std::string& key, const std::string& value) = 0;
  virtual bool Has(const std::string& key) = 0;
  virtual std::string Get(const std::string& key) = 0;
  virtual void Remove(const std::string& key) = 0;
};

class FileStore final : public Store, private gloo::rendezvous::FileStore {
 public:
  explicit FileStore(const std::string& dir) : gloo::rendezvous::FileStore(dir) {}
  void Set(const std::string& key, const std::string& value) override {
    set(key, std::vector<char>(value.begin(), value.end()));
  }
  bool Has(const std::string& key) override { return check({key}); }
  std::string Get(const std::string& key) override {
    std::vector<char> v = get(key);
    return std::string(v.begin(), v.end());
  }
  void Remove(const std::string& key) override { ::unlink(objectPath(key).c_str()); }
};

class RedisStore final : public Store, private gloo::rendezvous::RedisStore {
 public:
  RedisStore(const std::string& host, int port) : gloo::rendezvous::RedisStore(host, port) {}
  void Set(const std::string& key, const std::string& value) override {
    set(key, std::vector<char>(value.begin(), value.end()));
  }
  bool Has(const std::string& key) override { return check({key}); }
  std::string Get(const std::string& key) override {
    std::vector<char> v = get(key);
    return std::string(v.begin(), v.end());
  }
  void Remove(const std::string& key) override {
    void* reply = redisCommand(redis_, "DEL %b", key.data(), key.size());
    if (reply != nullptr) freeReplyObject(reply);
  }
};

Status MakeDirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "gloo: cannot create the rendezvous directory '" + partial + "'");
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument("gloo: rendezvous path '" + path + "' is not a directory");
  }
  return OkStatus();
}

// What a rank publishes: who it is (for error messages) and, for every peer, the address of its pair with that peer.
constexpr uint32_t kAddressMagic = 0x41474344;  // "DCGA"

struct Published {
  int world_size = 0;
  int rank = -1;
  std::string host;
  uint64_t pid = 0;
  std::vector<std::string> addresses;  // Indexed by peer; empty for the publisher itself.

  std::string Describe() const { return "host " + host + ", pid " + std::to_string(pid); }
};

std::string EncodePublished(const Published& p) {
  WireWriter w;
  w.U32(kAddressMagic);
  w.Var(1);  // Layout version.
  w.Var(static_cast<uint64_t>(p.world_size));
  w.Var(static_cast<uint64_t>(p.rank));
  w.Str(p.host);
  w.Var(p.pid);
  for (const std::string& a : p.addresses) w.Str(a);
  return w.Take();
}

bool DecodePublished(const std::string& bytes, Published* p) {
  WireReader r(bytes);
  uint32_t magic;
  uint64_t version, world, rank, pid;
  if (!r.U32(&magic) || magic != kAddressMagic || !r.Var(&version) || version != 1 || !r.Var(&world) ||
      !r.Var(&rank) || !r.Str(&p->host) || !r.Var(&pid) || world == 0 || world > (1u << 24) || rank >= world) {
    return false;
  }
  p->world_size = static_cast<int>(world);
  p->rank = static_cast<int>(rank);
  p->pid = pid;
  uint64_t entries = world;
  p->addresses.clear();
  for (uint64_t i = 0; i < entries; ++i) {
    std::string a;
    if (!r.Str(&a)) return false;
    p->addresses.push_back(std::move(a));
  }
  return r.done();
}

std::string LocalHostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

std::string AddressString(const std::string& bytes) {
  std::string s;
  std::string error;
  if (!CatchGloo([&] { s = gloo::transport::tcp::Address(std::vector<char>(bytes.begin(), bytes.end())).str(); },
                 &error)) {
    return "?";
  }
  return s;
}

class Rendezvous {
 public:
  Rendezvous(const GlooOptions& o, Clock::time_point deadline) : o_(o), deadline_(deadline) {
    where_ = o.rendezvous + (o.prefix.empty() ? "" : " (prefix '" + o.prefix + "')");
    who_ = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
  }
  ~Rendezvous() { RemoveOwnKey(); }

  Result<std::unique_ptr<Communicator>> Connect(const Target& target) {
    DCKPT_RETURN_IF_ERROR(OpenStore(target));
    std::shared_ptr<gloo::transport::Device> device;
    DCKPT_RETURN_IF_ERROR(CreateDevice(&device));

    // One pair (connection) per peer, each with its own address; the pairs are created before publishing.
    std::shared_ptr<gloo::transport::Context> context;
    Published mine;
    mine.world_size = o_.world_size;
    mine.rank = o_.rank;
    mine.host = LocalHostName();
    mine.pid = static_cast<uint64_t>(getpid());
    mine.addresses.resize(o_.world_size);
    std::string error;
    if (!CatchGloo(
            [&] {
              context = device->createContext(o_.rank, o_.world_size);
              // Pairs take this as their connect timeout when created.
              context->setTimeout(std::max(Millis(1), Until(deadline_)));
              for (int p = 0; p < o_.world_size; ++p) {
                if (p == o_.rank) continue;
                std::vector<char> a = context->createPair(p)->address().bytes();
                mine.addresses[p].assign(a.begin(), a.end());
              }
            },
            &error)) {
      return IoError("gloo: " + who_ + " could not open its listening sockets on " + device->str() + ": " + error);
    }

    DCKPT_RETURN_IF_ERROR(Publish(EncodePublished(mine)));
    std::vector<Published> peers(o_.world_size);
    DCKPT_RETURN_IF_ERROR(AwaitAndFetch(&peers));

    for (int p = 0; p < o_.world_size; ++p) {
      if (p == o_.rank) continue;
      const std::string& addr = peers[p].addresses[o_.rank];
      if (!CatchGloo([&] { context->getPair(p)->connect(std::vector<char>(addr.begin(), addr.end())); }, &error)) {
        const bool timed_out = error.find("imeout") != std::string::npos || Clock::now() >= deadline_;
        std::string msg = "gloo: " + who_ + " could not connect to rank " + std::to_string(p) + " (" +
                          peers[p].Describe() + ") at " + AddressString(addr) + " within " +
                          std::to_string(CountMs(o_.timeout)) + " ms (rendezvous " + where_ + "): " + error;
        return timed_out ? TimeoutError(msg) : IoError(msg);
      }
    }

    auto comm = std::make_unique<GlooCommunicator>(o_.rank, o_.world_size, std::move(device), std::move(context));
    // A first barrier proves every connection carries data before the group is handed out; once it passes, every
    // rank has read every published address, so the keys can go (and the prefix can be used again).
    Status st = comm->Barrier(std::max(Millis(1), Until(deadline_)));
    if (!st.ok()) return Status(st.code(), "gloo: forming the group through " + where_ + " failed: " + st.message());
    return std::unique_ptr<Communicator>(std::move(comm));
  }

 private:
  std::string Key(int rank) const {
    return (o_.prefix.empty() ? "" : o_.prefix + "/") + "dckpt.gloo.addr." + std::to_string(rank);
  }

  Status OpenStore(const Target& target) {
    std::string error;
    if (target.kind == Target::kFile) {
      DCKPT_RETURN_IF_ERROR(MakeDirs(target.path));
      if (!CatchGloo([&] { store_ = std::make_unique<FileStore>(target.path); }, &error)) {
        return IoError("gloo: cannot use the rendezvous directory '" + target.path + "': " + error);
      }
      return OkStatus();
    }
    if (!CatchGloo([&] { store_ = std::make_unique<RedisStore>(target.host, target.port); }, &error)) {
      return IoError("gloo: cannot reach the Redis rendezvous store at " + target.host + ":" +
                     std::to_string(target.port) + " (" + o_.rendezvous + ") from " + who_ + ": " + error);
    }
    return OkStatus();
  }

  Status CreateDevice(std::shared_ptr<gloo::transport::Device>* device) {
    gloo::transport::tcp::attr attr;
    std::string what;
    if (!o_.iface.empty()) {
      attr.iface = o_.iface;
      what = "network interface '" + o_.iface + "'";
    } else {
      attr.hostname = o_.hostname.empty() ? LocalHostName() : o_.hostname;
      what = o_.hostname.empty() ? "this host's name '" + attr.hostname + "'" : "address '" + o_.hostname + "'";
    }
    std::string error;
    if (!CatchGloo([&] { *device = gloo::transport::tcp::CreateDevice(attr); }, &error)) {
      return InvalidArgument("gloo: " + who_ + " cannot bind to " + what +
                             " (set GlooOptions::iface/hostname or DCKPT_GLOO_IFACE/DCKPT_GLOO_HOSTNAME): " + error);
    }
    return OkStatus();
  }

  Status Publish(const std::string& blob) {
    std::string error;
    if (!CatchGloo([&] { store_->Set(Key(o_.rank), blob); }, &error)) {
      if (error.find("already") != std::string::npos) {
        return Status(StatusCode::kExists,
                      "gloo: the rendezvous key of " + who_ + " already exists in " + where_ +
                          ": a group using this prefix is running, or one crashed before cleaning up; use a fresh "
                          "prefix or directory for each group: " +
                          error);
      }
      return IoError("gloo: " + who_ + " cannot publish its address in " + where_ + ": " + error);
    }
    published_ = true;
    return OkStatus();
  }

  Status AwaitAndFetch(std::vector<Published>* peers) {
    std::string error;
    // Wait for the ranks in order; a rank's key, once there, stays, so each is checked until it appears and then
    // never again. Polling is what Gloo's stores offer (inotify fails on shared file systems); it backs off to 50 ms.
    Millis nap(2);
    for (int p = 0; p < o_.world_size; ++p) {
      for (;;) {
        bool present = false;
        if (!CatchGloo([&] { present = store_->Has(Key(p)); }, &error)) {
          return IoError("gloo: " + who_ + " cannot read the rendezvous store " + where_ + ": " + error);
        }
        if (present) break;
        if (Clock::now() >= deadline_) return MissingRanks(p);
        std::this_thread::sleep_for(std::min(nap, Until(deadline_) + Millis(1)));
        nap = std::min(nap * 2, Millis(50));
      }
    }
    for (int p = 0; p < o_.world_size; ++p) {
      if (p == o_.rank) continue;
      std::string blob;
      if (!CatchGloo([&] { blob = store_->Get(Key(p)); }, &error)) {
        return IoError("gloo: " + who_ + " cannot read rank " + std::to_string(p) + "'s address from " + where_ +
                       ": " + error);
      }
      Published& peer = (*peers)[p];
      if (!DecodePublished(blob, &peer) || peer.rank != p) {
        return IoError("gloo: rank " + std::to_string(p) + "'s entry in " + where_ +
                       " is not a distckpt address record (another program using the same store and prefix?)");
      }
      if (peer.world_size != o_.world_size) {
        return InvalidArgument("gloo: rank " + std::to_string(p) + " (" + peer.Describe() +
                               ") joined with world size " + std::to_string(peer.world_size) + " but " + who_ +
                               " with " + std::to_string(o_.world_size) + " (rendezvous " + where_ + ")");
      }
    }
    return OkStatus();
  }

  Status MissingRanks(int first) {
    std::vector<int> missing{first};
    std::string error;
    for (int p = first + 1; p < o_.world_size; ++p) {
      bool present = true;
      CatchGloo([&] { present = store_->Has(Key(p)); }, &error);
      if (!present) missing.push_back(p);
    }
    return TimeoutError("gloo: rendezvous through " + where_ + " timed out after " +
                        std::to_string(CountMs(o_.timeout)) + " ms on " + who_ + ": " + RankWord(missing) + " " +
                        JoinRanks(missing) + " never published " + (missing.size() == 1 ? "its" : "their") +
                        " address (not started, crashed, or using a different rendezvous, prefix or world size)");
  }

  void RemoveOwnKey() {
    if (!published_ || !store_) return;
    published_ = false;
    std::string ignored;
    CatchGloo([&] { store_->Remove(Key(o_.rank)); }, &ignored);
  }

  const GlooOptions& o_;
  const Clock::time_point deadline_;
  std::string where_;
  std::string who_;
  std::unique_ptr<Store> store_;
  bool published_ = false;
};

// Environment parsing.

Result<long long> ParseEnvInt(const char* var, const char* value, long long min, long long max) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < min || v > max) {
    return InvalidArgument(std::string("gloo: environment variable ") + var + "='" + value + "' is not an integer in " +
                           std::to_string(min) + ".." + std::to_string(max));
  }
  return v;
}

// The first of `vars` that is set (and not empty), or nullptr.
const char* FirstSet(std::initializer_list<const char*> vars, const char** which) {
  for (const char* v : vars) {
    const char* value = std::getenv(v);
    if (value != nullptr && value[0] != '\0') {
      *which = v;
      return value;
    }
  }
  return nullptr;
}

}  // namespace
}  // namespace internal_gloo

Result<GlooOptions> GlooOptionsFromEnv(GlooOptions o) {
  using internal_gloo::FirstSet;
  using internal_gloo::ParseEnvInt;
  const char* var = nullptr;
  if (o.rank < 0) {
    const char* v = FirstSet({"DCKPT_RANK", "RANK"}, &var);
    if (v == nullptr) {
      return InvalidArgument("gloo: the rank is not set: set GlooOptions::rank or the environment variable "
                             "DCKPT_RANK (or RANK)");
    }
    DCKPT_ASSIGN_OR_RETURN(long long r, ParseEnvInt(var, v, 0, INT_MAX - 1));
    o.rank = static_cast<int>(r);
  }
  if (o.world_size < 0) {
    const char* v = FirstSet({"DCKPT_WORLD_SIZE", "WORLD_SIZE"}, &var);
    if (v == nullptr) {
      return InvalidArgument("gloo: the world size is not set: set GlooOptions::world_size or the environment "
                             "variable DCKPT_WORLD_SIZE (or WORLD_SIZE)");
    }
    DCKPT_ASSIGN_OR_RETURN(long long n, ParseEnvInt(var, v, 1, INT_MAX));
    o.world_size = static_cast<int>(n);
  }
  if (o.rendezvous.empty()) {
    const char* v = FirstSet({"DCKPT_RENDEZVOUS"}, &var);
    if (v == nullptr) {
      return InvalidArgument("gloo: no rendezvous: set GlooOptions::rendezvous or the environment variable "
                             "DCKPT_RENDEZVOUS (file:///shared/dir or redis://host:port)");
    }
    o.rendezvous = v;
  }
  if (o.iface.empty()) {
    if (const char* v = FirstSet({"DCKPT_GLOO_IFACE"}, &var)) o.iface = v;
  }
  if (o.hostname.empty()) {
    if (const char* v = FirstSet({"DCKPT_GLOO_HOSTNAME"}, &var)) o.hostname = v;
  }
  if (o.timeout == kDefaultCollectiveTimeout || o.timeout.count() <= 0) {
    o.timeout = kDefaultCollectiveTimeout;
    if (const char* v = FirstSet({"DCKPT_TIMEOUT_MS"}, &var)) {
      DCKPT_ASSIGN_OR_RETURN(long long ms, ParseEnvInt(var, v, 1, 1000LL * 60 * 60 * 24 * 365));
      o.timeout = std::chrono::milliseconds(ms);
    }
  }
  return o;
}

Result<std::unique_ptr<Communicator>> NewGlooCommunicator(const GlooOptions& options) {
  using internal_gloo::Clock;
  if (options.world_size < 1) {
    return InvalidArgument("gloo: world size " + std::to_string(options.world_size) + " is not positive");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("gloo: rank " + std::to_string(options.rank) + " is not in [0, " +
                           std::to_string(options.world_size) + ")");
  }
  if (options.timeout.count() <= 0) {
    return InvalidArgument("gloo: the rendezvous timeout must be positive, not " +
                           std::to_string(options.timeout.count()) + " ms");
  }
  DCKPT_ASSIGN_OR_RETURN(internal_gloo::Target target, internal_gloo::ParseRendezvous(options.rendezvous));
  // Created before Gloo's event loop thread so that thread inherits the blocked SIGPIPE.
  internal_gloo::SigpipeBlocker sigpipe;
  try {
    internal_gloo::Rendezvous rendezvous(options, Clock::now() + options.timeout);
    return rendezvous.Connect(target);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kNoMemory, "gloo: out of memory while forming the group");
  } catch (const std::exception& e) {
    return Internal("gloo: forming the group failed: " + internal_gloo::CleanGlooMessage(e.what()));
  } catch (...) {
    return Internal("gloo: forming the group failed with an unknown exception");
  }
}

}  // namespace distckpt
