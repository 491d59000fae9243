// The Gloo communicator: the transport (point-to-point messages with headers, the watchdog, SIGPIPE handling) and
// the collectives over it, plus NewGlooCommunicator, which forms the group through gloo_rendezvous.h.
#include "core/comm/gloo/gloo.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
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
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/comm/collective_call.h"
#include "core/comm/gloo/gloo_rendezvous.h"
#include "core/comm/gloo/gloo_util.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/unbound_buffer.h"

namespace distckpt {
namespace internal_gloo {
namespace {

using gloo::transport::UnboundBuffer;
using internal_comm::Call;
using internal_comm::Op;
using internal_comm::OpName;

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
// Message k > 0 of a collective to the same peer (SendRecvInto's further messages) has its own two slots above bit 48
// (the counter stays far below 2^47).
uint64_t HeaderSlot(uint64_t seq, int k = 0) { return (seq << 1) | (static_cast<uint64_t>(k) << 48); }
uint64_t PayloadSlot(uint64_t seq, int k = 0) { return (seq << 1) | 1 | (static_cast<uint64_t>(k) << 48); }
// At most this many messages to one peer in one collective.
constexpr int kMaxMessagesPerPeer = 1 << 14;
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
// or throws, we know which rank we were waiting for. A collective that sends several messages to one peer
// (SendRecvInto) has `per_peer` channels per peer: channel k * size + peer carries message k; the methods' `peer` is a
// channel, which is the rank itself for message 0. Buffers destroyed with an operation still pending are dropped
// by Gloo (its pairs hold weak references); the communicator closes its connections first whenever that can happen.
class Exchange {
 public:
  Exchange(Group& group, const Call& call, int per_peer = 1)
      : g_(group), call_(call), peers_(static_cast<size_t>(group.size) * static_cast<size_t>(per_peer)) {}

  /// The channel of message k to or from `rank`.
  int Channel(int rank, int k) const { return k * g_.size + rank; }

  /// Adds a note shown after `peer` in errors, e.g. "relaying the broadcast from rank 3".
  void SetNote(int peer, std::string note) { peers_[peer].note = std::move(note); }

  /// Sends a header and `payload` to `peer`. `payload` must outlive Finish(). `deadline` bounds the wait for the
  /// send to complete (default: the collective's).
  void PostSend(int peer, std::string_view payload, uint32_t flags = 0,
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
          p.out_hdr_buf->send(RankOf(peer), HeaderSlot(call_.seq, KOf(peer)));
          if (!payload.empty()) {
            // Gloo only reads from a buffer it sends.
            p.out_data_buf = g_.context->createUnboundBuffer(const_cast<char*>(payload.data()), payload.size());
            p.out_data_buf->send(RankOf(peer), PayloadSlot(call_.seq, KOf(peer)));
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
          p.in_hdr_buf->recv(RankOf(peer), HeaderSlot(call_.seq, KOf(peer)));
        },
        &error);
    if (!ok) RecordFailure(peer, Outcome::kFailed, error, /*arrival=*/true);
  }

  /// Waits (until `deadline`, default the collective's) for `peer`'s header, checks it and posts the receive of its
  /// payload into *out. Returns false if that failed (the failure is recorded).
  bool AwaitHeader(int peer, std::string* out, Clock::time_point deadline = Clock::time_point::max()) {
    return AwaitHeaderInto(peer, out, nullptr, deadline);
  }

  /// As AwaitHeader, but the payload goes straight to `into` (SendRecvInto), which must be the size the header
  /// announces: a payload of another size is received into *out instead, and the peer's receive fails naming both.
  bool AwaitHeaderInto(int peer, std::string* out, const Communicator::RecvInto* into,
                       Clock::time_point deadline = Clock::time_point::max()) {
    Peer& p = peers_[peer];
    if (p.failed || !p.in_hdr_buf) return false;
    std::string error;
    Outcome o = Wait(p.in_hdr_buf.get(), /*recv=*/true, RankOf(peer), Deadline(deadline), &error);
    if (o != Outcome::kDone) {
      RecordFailure(peer, o, error, /*arrival=*/true);
      return false;
    }
    const Header& h = p.in_hdr;
    if (h.magic != kMagic || h.op != static_cast<uint32_t>(call_.op) || h.root != call_.root || h.seq != call_.seq) {
      p.failed = true;
      if (mismatch_.empty()) {
        mismatch_ = "collective mismatch at " + call_.Describe() + ": this rank (" + g_.Who() + ") called " +
                    call_.Name() + " but rank " + std::to_string(RankOf(peer)) + " sent " +
                    (h.magic == kMagic ? OpName(h.op, h.root) + " #" + std::to_string(h.seq)
                                       : std::string("a message that is not from distckpt")) +
                    "; every rank must call the same collectives in the same order";
      }
      return false;
    }
    p.upstream_abort = (h.flags & kFlagAbort) != 0;
    std::string* dst = p.upstream_abort ? &p.abort_message : out;
    const bool in_place = into != nullptr && !p.upstream_abort && h.size == into->size;
    if (into != nullptr && !p.upstream_abort && !in_place && wrong_size_.empty()) {
      wrong_size_ = CheckReceivedSize(*into, h.size).message();
    }
    // Sized, not cleared: the receive overwrites every byte, and a buffer reused across calls (SendRecv rounds) at the
    // same size is then not rewritten at all. May throw bad_alloc: reported as kNoMemory.
    if (!in_place && dst->size() != h.size) dst->resize(static_cast<size_t>(h.size));
    if (h.size > 0) {
      p.payload_pending = true;
      bool ok = CatchGloo(
          [&] {
            p.in_data_buf = in_place ? g_.context->createUnboundBuffer(into->data, into->size)
                                     : g_.context->createUnboundBuffer(&(*dst)[0], dst->size());
            p.in_data_buf->recv(RankOf(peer), PayloadSlot(call_.seq, KOf(peer)));
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
      upstream_.push_back({RankOf(peer), p.abort_message});
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
    Outcome o = Wait(p.in_data_buf.get(), /*recv=*/true, RankOf(peer), Deadline(deadline), &error);
    if (o != Outcome::kDone) {
      RecordFailure(peer, o, error, /*arrival=*/false);
      return false;
    }
    return true;
  }

  /// Waits for every receive and send still in flight, then reports the outcome of the whole collective.
  Status Finish() {
    const int channels = static_cast<int>(peers_.size());
    for (int ch = 0; ch < channels; ++ch) AwaitPayload(ch);
    for (int ch = 0; ch < channels; ++ch) AwaitSend(ch);
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
      return Status(StatusCode::kPeer,
                    "gloo: " + call_.Describe() + " failed" + where + " (timeout " + timeout + "): the connection to " +
                        LostRanks() + note +
                        " closed; it exited, crashed or gave up on the group: " + lost_.front().detail);
    }
    if (!wrong_size_.empty()) return Internal("gloo: " + call_.Describe() + where + ": " + wrong_size_);
    return OkStatus();
  }

 private:
  enum class Outcome { kDone, kTimedOut, kFailed };

  int RankOf(int channel) const { return channel % g_.size; }
  int KOf(int channel) const { return channel / g_.size; }

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
  void RecordFailure(int channel, Outcome o, const std::string& error, bool arrival) {
    Peer& p = peers_[channel];
    if (p.failed) return;
    p.failed = true;
    p.payload_pending = false;
    const int peer = RankOf(channel);
    if (o == Outcome::kFailed && !gave_up_) {
      if (std::none_of(lost_.begin(), lost_.end(), [&](const Failure& f) { return f.peer == peer; })) {
        lost_.push_back({peer, error});
      }
      return;
    }
    if (std::find(timed_out_.begin(), timed_out_.end(), peer) != timed_out_.end()) return;
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
      Outcome o = Wait(buf, /*recv=*/false, RankOf(peer), p.send_deadline, &error, /*force=*/p.forward);
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
  std::vector<Peer> peers_;  // Indexed by channel; never resized, since Gloo holds pointers into it.
  bool gave_up_ = false;     // This rank's deadline passed.
  std::vector<int> timed_out_;
  std::vector<Failure> lost_;
  std::vector<Failure> upstream_;
  std::string mismatch_;
  std::string wrong_size_;  // SendRecvInto: a payload of another size than the caller expects (the first)
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

  // Directly between the ranks concerned: each message goes only from its sender to its receiver.
  // Every peer of a SendRecv is another rank of the group (`recv_peer(i)`: receive i's).
  template <typename RecvPeer>
  Status CheckPeers(const std::vector<std::pair<int, std::string_view>>& sends, size_t n_recvs,
                    RecvPeer&& recv_peer) const {
    const int n = g_.size, me = g_.rank;
    auto bad = [&](int peer) { return peer < 0 || peer >= n || peer == me; };
    for (const auto& s : sends) {
      if (bad(s.first))
        return InvalidArgument("gloo: sendrecv on " + g_.Who() + ": no peer rank " + std::to_string(s.first));
    }
    for (size_t i = 0; i < n_recvs; ++i) {
      if (bad(recv_peer(i))) {
        return InvalidArgument("gloo: sendrecv on " + g_.Who() + ": no peer rank " + std::to_string(recv_peer(i)));
      }
    }
    return OkStatus();
  }

  Status SendRecv(const std::vector<std::pair<int, std::string_view>>& sends,
                  const std::vector<std::pair<int, std::string*>>& recvs, Millis timeout) override {
    DCKPT_RETURN_IF_ERROR(CheckPeers(sends, recvs.size(), [&](size_t i) { return recvs[i].first; }));
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kSendRecv, -1, timeout, &call));
    return Run(call, [&](Exchange& x) {
      for (const auto& s : sends) x.PostSend(s.first, s.second);
      for (const auto& r : recvs) x.PostHeaderRecv(r.first);
      for (const auto& r : recvs) x.AwaitHeader(r.first, r.second);
    });
  }

  // As SendRecv; each payload is received straight into the caller's memory. The messages to one peer are all in
  // flight at once, each on a channel of its own, matched in order with the peer's receives.
  Status SendRecvInto(const std::vector<std::pair<int, std::string_view>>& sends, const std::vector<RecvInto>& recvs,
                      Millis timeout) override {
    DCKPT_RETURN_IF_ERROR(CheckPeers(sends, recvs.size(), [&](size_t i) { return recvs[i].peer; }));
    // Message k to (from) a peer is the k-th send to (receive from) it in the call.
    std::vector<int> count(g_.size, 0);
    std::vector<int> send_k(sends.size()), recv_k(recvs.size());
    int per_peer = 1;
    for (size_t i = 0; i < sends.size(); ++i) per_peer = std::max(per_peer, (send_k[i] = count[sends[i].first]++) + 1);
    std::fill(count.begin(), count.end(), 0);
    for (size_t i = 0; i < recvs.size(); ++i) per_peer = std::max(per_peer, (recv_k[i] = count[recvs[i].peer]++) + 1);
    if (per_peer > kMaxMessagesPerPeer) {
      return InvalidArgument("gloo: sendrecv on " + g_.Who() + ": " + std::to_string(per_peer) +
                             " messages to or from one peer in one call (at most " +
                             std::to_string(kMaxMessagesPerPeer) + ")");
    }
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kSendRecv, -1, timeout, &call));
    // A payload of the wrong size lands in a scratch string of its peer's (received, then refused).
    std::vector<std::string> scratch(recvs.size());
    return Run(
        call,
        [&](Exchange& x) {
          for (size_t i = 0; i < sends.size(); ++i) x.PostSend(x.Channel(sends[i].first, send_k[i]), sends[i].second);
          for (size_t i = 0; i < recvs.size(); ++i) x.PostHeaderRecv(x.Channel(recvs[i].peer, recv_k[i]));
          for (size_t i = 0; i < recvs.size(); ++i) {
            x.AwaitHeaderInto(x.Channel(recvs[i].peer, recv_k[i]), &scratch[i], &recvs[i]);
          }
        },
        per_peer);
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
    // Depth of the whole tree.
    int levels = 0;
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
  Status Run(const Call& call, Body&& body, int per_peer = 1) {
    SigpipeBlocker sigpipe;
    std::unique_ptr<Exchange> x;
    Status st;
    try {
      x = std::make_unique<Exchange>(g_, call, per_peer);
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

}  // namespace
}  // namespace internal_gloo

Result<std::unique_ptr<Communicator>> NewGlooCommunicator(const GlooOptions& options) {
  using internal_gloo::Clock;
  DCKPT_RETURN_IF_ERROR(CheckGlooOptions(options));
  DCKPT_ASSIGN_OR_RETURN(internal_gloo::Target target, internal_gloo::ParseRendezvous(options.rendezvous));
  // Created before Gloo's event loop thread so that thread inherits the blocked SIGPIPE.
  internal_gloo::SigpipeBlocker sigpipe;
  try {
    const Clock::time_point deadline = Clock::now() + options.timeout;
    internal_gloo::Rendezvous rendezvous(options, deadline);
    DCKPT_ASSIGN_OR_RETURN(internal_gloo::ConnectedTransport transport, rendezvous.Connect(target));
    auto comm = std::make_unique<internal_gloo::GlooCommunicator>(
        options.rank, options.world_size, std::move(transport.device), std::move(transport.context));
    // A first barrier proves every connection carries data before the group is handed out; once it passes, every
    // rank has read every published address, so the rendezvous (its destructor) removes this rank's key and the
    // prefix can be used again.
    Status st = comm->Barrier(std::max(internal_gloo::Millis(1), internal_gloo::Until(deadline)));
    if (!st.ok()) {
      return Status(st.code(), "gloo: forming the group through " + rendezvous.where() + " failed: " + st.message());
    }
    return std::unique_ptr<Communicator>(std::move(comm));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kNoMemory, "gloo: out of memory while forming the group");
  } catch (const std::exception& e) {
    return Internal("gloo: forming the group failed: " + internal_gloo::CleanGlooMessage(e.what()));
  } catch (...) {
    return Internal("gloo: forming the group failed with an unknown exception");
  }
}

}  // namespace distckpt
