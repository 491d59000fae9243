#include "core/manager/manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <string_view>
#include <thread>

#include "core/base/box.h"
#include "core/base/wire.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/load.h"
#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/manager/arrival_check.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"
#include "core/plan/save_planner.h"
#include "core/storage/fault/fault_storage.h"
#include "core/tools/leftovers.h"

namespace distckpt {
using namespace manager_internal;  // NOLINT: the package's own helpers

namespace {

// What a part of `state` takes on disk, at least: each piece and bytes entry starts on a 4 KiB boundary, and the
// metadata has a few hundred bytes per entry.
uint64_t PartBytesEstimate(const State& state) {
  auto align = [](uint64_t n) { return (n + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment; };
  uint64_t total = 4096, entries = 0;
  for (const TensorEntry& t : state.tensors()) {
    for (const TensorPiece& p : t.pieces) total += align(p.box.volume() * DTypeSize(t.dtype)), ++entries;
  }
  for (const BytesEntry& b : state.bytes()) total += align(b.size), ++entries;
  return total + 512 * entries;
}

uint64_t StateBytes(const State& state) {
  uint64_t total = 0;
  for (const TensorEntry& t : state.tensors()) {
    for (const TensorPiece& p : t.pieces) total += p.box.volume() * DTypeSize(t.dtype);
  }
  for (const BytesEntry& b : state.bytes()) total += b.size;
  return total;
}

// `path` and the directories above it, as mkdir -p.
Status MakeDirs(Storage* storage, const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    Status made = storage->CreateDir(path.substr(0, at));
    if (!made.ok() && made.code() != StatusCode::kExists) return made;
    if (at == std::string::npos) return OkStatus();
  }
}

// Test only: DCKPT_TEST_MANAGER_FAULTS=<rules> (core/storage/fault/fault_storage.h's text form) puts the local tier
// and the persistent storage of every manager this process creates behind a FaultStorage with those rules (each
// storage counts its own operations), so that tests of real processes (python/tests/test_manager.py) can kill a rank
// with SIGKILL at an exact operation of replicating or persisting. Read once.
Result<std::vector<FaultRule>> TestFaultRules() {
  static const char* const text = std::getenv("DCKPT_TEST_MANAGER_FAULTS");
  if (text == nullptr || *text == '\0') return std::vector<FaultRule>();
  auto rules = ParseFaultRules(text);
  if (!rules.ok())
    return InvalidArgument("DCKPT_TEST_MANAGER_FAULTS (a test-only setting): " + rules.status().message());
  return rules;
}

}  // namespace

size_t DefaultManagerThreads() {
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::min<size_t>(4, std::max<size_t>(1, cores / 4));
}

ManagerStats CheckpointManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// Steps staged but not yet complete (queued or being processed) that Save lets exist before it waits.
constexpr size_t kMaxInFlight = 2;

struct CheckpointManager::Job {
  uint64_t step = 0;
  bool persist = false;
  std::unique_ptr<SaveFuture> future;
  Status staged;
  std::string layout;            // EncodeLayout of the state
  uint64_t keep = 0;             // complete steps this rank's budget lets the node keep
  uint64_t staging_charge = 0;   // bytes of the budget held until the part is written
  std::unique_ptr<Again> again;  // instead of a step saved: the copies of a restored step made again
};

CheckpointManager::CheckpointManager(Communicator* comm, const ManagerOptions& options)
    : comm_(comm), options_(options), local_(options.local_storage ? options.local_storage : DefaultStorage()) {}

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::Create(Communicator* comm,
                                                                     const ManagerOptions& options) {
  if (options.local_dir.empty()) return InvalidArgument("checkpoint manager: no local directory");
  if (options.node_id.empty()) return InvalidArgument("checkpoint manager: no node id");
  if ((options.replicas < 0 || options.replicas > 2) && options.replicas != kAutoReplicas) {
    return InvalidArgument("checkpoint manager: replicas must be 0, 1 or 2, not " + std::to_string(options.replicas));
  }
  if (options.keep_local < 1) return InvalidArgument("checkpoint manager: keep_local must be at least 1");
  DCKPT_RETURN_IF_ERROR(CheckCompression(options.persist_compression, options.persist_compression_level,
                                         "checkpoint manager: persist_compression"));
  if (options.exchange_round_bytes == 0) return InvalidArgument("checkpoint manager: exchange_round_bytes is 0");
  if (comm) {
    // The manager's collectives run on its background thread, beside the caller's own work: as for SaveAsync, a
    // communicator whose collectives are device work (NCCL) is refused, saying what to pass instead.
    DCKPT_RETURN_IF_ERROR(comm->CheckBackgroundUse().WithContext("checkpoint manager"));
  }
  std::unique_ptr<CheckpointManager> m(new CheckpointManager(comm, options));
  m->keep_ = static_cast<uint64_t>(options.keep_local);
  if (!comm) {
    m->single_ = NewSingleProcessCommunicator();
    m->comm_ = m->single_.get();
  }
  Communicator* c = m->comm_;
  const int size = c->size(), me = c->rank();
  m->persistent_ = options.persistent_storage ? options.persistent_storage.get() : DefaultStorage();
  DCKPT_ASSIGN_OR_RETURN(std::vector<FaultRule> faults, TestFaultRules());
  if (!faults.empty()) {
    m->local_faults_ = std::make_unique<FaultStorage>(m->local_, faults);
    m->local_ = m->local_faults_.get();
    // Holds the persistent storage it wraps, which options_ keeps alive.
    m->persistent_faults_ = std::make_shared<FaultStorage>(m->persistent_, faults);
    m->persistent_ = m->persistent_faults_.get();
  }

  // Node ids and the run id (rank 0's nonce) in one AllGather, so that the replicas are checked against the nodes
  // before anything is created.
  WireWriter w;
  w.Str(options.node_id);
  w.Str(NewNonce());
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(c->AllGather(w.Take(), &all, options.timeout));
  std::set<std::string> ids;
  for (int r = 0; r < size; ++r) {
    WireReader rd(all[r]);
    std::string node, nonce;
    if (!rd.Str(&node) || !rd.Str(&nonce)) return Internal("checkpoint manager: malformed hello");
    m->node_of_.push_back(node);
    ids.insert(node);
    if (r == 0) m->run_ = nonce;
  }
  std::vector<std::string> sorted(ids.begin(), ids.end());
  m->nodes_.resize(sorted.size());
  m->node_index_.resize(size);
  for (int r = 0; r < size; ++r) {
    int n = static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), m->node_of_[r]) - sorted.begin());
    m->node_index_[r] = n;
    m->nodes_[n].push_back(r);
  }
  const int nodes = static_cast<int>(sorted.size());
  if (options.replicas == kAutoReplicas) {
    // The default: a copy on another node where the job has one.
    m->options_.replicas = nodes > 1 ? 1 : 0;
    m->setup_note_ = "replicas: " + std::to_string(m->options_.replicas) + " (the default: " +
                     (nodes > 1 ? std::string("1 where the job has other nodes")
                                : "the job has one node, so no "
                                  "other node holds a copy") +
                     ")\n";
  }
  const int replicas = m->options_.replicas;
  if (replicas >= nodes) {
    return InvalidArgument("checkpoint manager: " + std::to_string(replicas) +
                           " replicas need as many other nodes, but the job has " + std::to_string(nodes) +
                           " node(s) (node ids: " + std::string(sorted.size() > 0 ? sorted[0] : "") +
                           (sorted.size() > 1 ? ", ..." : "") + "); nothing was created");
  }
  // Then the directories; a rank whose local directory is unusable says so, and every rank learns it.
  Status local = MakeDirs(m->local_, options.local_dir);
  if (local.ok()) {
    auto is_dir = m->local_->IsDirectory(options.local_dir);
    if (!is_dir.ok()) local = is_dir.status();
    else if (!is_dir.value()) local = InvalidArgument("'" + options.local_dir + "' is not a directory");
  }
  if (!local.ok()) local = local.WithContext("checkpoint manager: local directory");
  if (local.ok() && me == 0 && !options.persistent_path.empty() &&
      m->persistent_->commit_protocol() == CommitProtocol::kRename) {
    // The persistent directory and those above it (object stores have no directories).
    local = MakeDirs(m->persistent_, options.persistent_path).WithContext("checkpoint manager: persistent directory");
  }
  DCKPT_ASSIGN_OR_RETURN(std::vector<Status> statuses, GatherStatuses(c, local, options.timeout));
  DCKPT_RETURN_IF_ERROR(FirstFailure(statuses, me).WithContext("checkpoint manager"));
  // Replica k of rank r goes to the node k places after r's, to the rank with r's place on its own node.
  m->targets_of_.resize(size);
  for (int r = 0; r < size; ++r) {
    const int n = m->node_index_[r];
    const auto& mine = m->nodes_[n];
    const size_t local_index = std::find(mine.begin(), mine.end(), r) - mine.begin();
    for (int k = 1; k <= replicas; ++k) {
      const auto& other = m->nodes_[(n + k) % nodes];
      m->targets_of_[r].push_back(other[local_index % other.size()]);
    }
  }
  m->targets_ = m->targets_of_[me];
  for (int r = 0; r < size; ++r) {
    for (int t : m->targets_of_[r]) {
      if (t == me) m->sources_.push_back(r);
    }
  }
  // A restore of an earlier version that died left its scratch checkpoint (hard links and fetched bytes): it goes.
  const std::string scratch_prefix = "restore-r" + std::to_string(me) + ".";
  if (auto listed = m->local_->ListDir(options.local_dir); listed.ok()) {
    for (const std::string& name : listed.value()) {
      if (name.compare(0, scratch_prefix.size(), scratch_prefix) == 0) {
        (void)m->local_->RemoveAll(options.local_dir + "/" + name);
      }
    }
  }
  // The newest complete step already on this node (a restarted job).
  auto names = m->local_->ListDir(options.local_dir);
  if (names.ok()) {
    for (const std::string& name : names.value()) {
      uint64_t step;
      if (!ParseNumbered(name, "step-", 10, &step)) continue;
      auto inside = m->local_->ListDir(options.local_dir + "/" + name);
      if (!inside.ok()) continue;
      for (const std::string& f : inside.value()) {
        uint64_t r;
        if (ParseNumbered(f, "complete-", 5, &r) && (!m->latest_ || *m->latest_ < step)) m->latest_ = step;
      }
    }
  }
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

CheckpointManager::~CheckpointManager() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string CheckpointManager::StepDir(uint64_t step) const { return options_.local_dir + "/" + StepName(step); }
std::string CheckpointManager::PartDir(uint64_t step, uint32_t rank) const {
  return StepDir(step) + "/" + PartName(rank);
}

Result<std::vector<Part>> CheckpointManager::ParseParts(uint64_t step, const std::vector<std::string>& metadata) const {
  std::vector<Part> parts;
  for (uint32_t r = 0; r < metadata.size(); ++r) {
    DCKPT_ASSIGN_OR_RETURN(Part part, ParsePart(metadata[r], PartDir(step, r)));
    parts.push_back(std::move(part));
  }
  return parts;
}

void CheckpointManager::Fail(const Status& st) {
  if (error_.ok()) error_ = st;
}

Status CheckpointManager::Save(uint64_t step, const State& state, bool persist) {
  const uint64_t bytes = StateBytes(state);
  // A part takes more than the state's bytes (chunks start on 4 KiB boundaries, and the metadata): the last part
  // written tells how much more.
  uint64_t part_estimate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    part_estimate = std::max(PartBytesEstimate(state), last_part_bytes_);
  }
  const uint64_t tier_charge = part_estimate * (1 + static_cast<uint64_t>(options_.replicas));
  const uint64_t charge = tier_charge + bytes;  // the tier's copies and the staging until the part is written
  uint64_t keep = static_cast<uint64_t>(options_.keep_local);
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Back-pressure is counted as it starts (a monitor sees a save waiting) and timed when it ends, however it ends.
    struct WaitClock {
      ManagerStats* stats;
      bool waiting = false, for_budget = false;
      std::chrono::steady_clock::time_point start{};
      void Start(bool budget) {
        if (budget && !for_budget) for_budget = true, ++stats->saves_waited_for_budget;
        if (waiting) return;
        waiting = true;
        ++stats->saves_waited;
        start = std::chrono::steady_clock::now();
      }
      ~WaitClock() {  // runs before `lock` is released
        if (!waiting) return;
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        stats->wait_seconds += s;
        stats->max_wait_seconds = std::max(stats->max_wait_seconds, s);
      }
    } clock{&stats_};
    if (!broken_.ok()) return broken_;
    if (last_saved_ && step <= *last_saved_) {
      return InvalidArgument("checkpoint manager: step " + std::to_string(step) +
                             " is not after the last step saved (" + std::to_string(*last_saved_) + ")");
    }
    if (!error_.ok()) {
      Status st = error_;
      error_ = OkStatus();
      return st;
    }
    const uint64_t budget = options_.local_budget_bytes;
    if (budget) {
      // One complete step kept and this one in flight is the least a budget must hold; it keeps as many of the
      // keep_local newest complete steps as fit beside the one in flight (the ranks agree on the fewest).
      const uint64_t least = tier_charge + charge;
      if (least > budget) {
        return InvalidArgument("checkpoint manager: step " + std::to_string(step) + " of " + std::to_string(bytes) +
                               " bytes on rank " + std::to_string(comm_->rank()) + " needs " + std::to_string(least) +
                               " bytes of the local tier (one complete step kept and one in flight, each with " +
                               std::to_string(options_.replicas) +
                               " replica(s) of another rank's part, plus the staging), more than "
                               "local_budget_bytes (" +
                               std::to_string(budget) + ")");
      }
      keep = std::min<uint64_t>(static_cast<uint64_t>(options_.keep_local), (budget - charge) / tier_charge);
      // Back-pressure: wait for steps in flight (each completion drops the steps no longer kept).
      const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
      while (charged_total_ + charge > budget && (busy_ || !queue_.empty())) {
        clock.Start(/*budget=*/true);
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
          return TimeoutError("checkpoint manager: step " + std::to_string(step) +
                              " waited for the local tier's budget past the timeout");
        }
        if (!broken_.ok()) return broken_;
      }
    }
    // At most kMaxInFlight steps wait for the background, budget or not: a loop that saves faster than steps can be
    // written and replicated slows down to that pace instead of queueing copies of its state without end.
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (queue_.size() + (busy_ ? 1 : 0) >= kMaxInFlight) {
      clock.Start(/*budget=*/false);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        return TimeoutError("checkpoint manager: step " + std::to_string(step) +
                            " waited past the timeout for earlier steps to be written and replicated");
      }
      if (!broken_.ok()) return broken_;
    }
    last_saved_ = step;
    charged_[step] += charge;
    charged_total_ += charge;
    ++stats_.steps_saved;
  }
  auto job = std::make_unique<Job>();
  job->step = step;
  job->persist = persist || (options_.persist_every && step % options_.persist_every == 0);
  job->staging_charge = bytes;
  job->layout = EncodeLayout(state);
  job->keep = keep;
  PartInfo info{static_cast<uint32_t>(comm_->rank()), static_cast<uint32_t>(comm_->size()), step};
  Status st = OkStatus();
  auto part = MakePartState(state, info);
  if (!part.ok()) st = part.status();
  if (st.ok()) {
    part.value().SetUserMetadata("dckpt.run", run_);
    st = local_->CreateDir(StepDir(step));
    if (st.code() == StatusCode::kExists) st = OkStatus();
  }
  if (st.ok()) {
    // A step saved again (a run after a restore): this rank's marker of the earlier run goes first.
    st = local_->RemoveAll(StepDir(step) + "/" + CompleteName(comm_->rank()));
  }
  if (st.ok()) {
    SaveOptions so;
    so.overwrite = true;
    so.storage = local_;
    so.timeout = options_.timeout;
    so.device_snapshot = options_.device_snapshot;
    so.copy_engine = options_.copy_engine;
    so.io_threads = options_.threads ? options_.threads : DefaultManagerThreads();
    so.staging_threads = std::max(1u, std::thread::hardware_concurrency());  // the caller waits for the staging
    so.background_priority = options_.background_priority;
    // A part is never an incremental save's base: no second hash of every byte, unless the step is persisted
    // incrementally (persisting compares the part's chunk hashes with the previous persisted step's).
    so.chunk_hashes = job->persist && options_.persist_incremental && !options_.persistent_path.empty();
    auto future = SaveAsync(PartDir(step, comm_->rank()), part.value(), nullptr, so);
    if (future.ok()) job->future = std::move(future).value();
    else st = future.status();
  }
  job->staged = st.ok() ? OkStatus() : st.WithContext("checkpoint manager: staging step " + std::to_string(step));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  // A staging failure is this call's error; the background still runs the step's collectives with it (the other ranks
  // learn that the step is not complete).
  return st.ok() ? OkStatus() : st.WithContext("checkpoint manager: step " + std::to_string(step));
}

void CheckpointManager::QueueCopies(std::unique_ptr<Again> again) {
  auto job = std::make_unique<Job>();
  job->step = again->step;
  job->again = std::move(again);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

Status CheckpointManager::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [&] { return queue_.empty() && !busy_; };
  // A century or more is a wait without a deadline: wait_for converts the timeout to nanoseconds past now, which
  // overflows past ~292 years (UBSan caught dckpt_manager_wait(DCKPT_WAIT_FOREVER), capped to 2^53 ms, doing so), as
  // save_async.cc's kWaitForever says for asynchronous saves.
  if (timeout >= std::chrono::hours(24 * 365 * 100)) {
    cv_.wait(lock, idle);
  } else if (!cv_.wait_for(lock, timeout, idle)) {
    return TimeoutError("checkpoint manager: steps still in flight after " + std::to_string(timeout.count()) + " ms");
  }
  Status st = error_;
  error_ = OkStatus();
  if (st.ok() && !broken_.ok()) st = broken_;
  return st;
}

std::optional<uint64_t> CheckpointManager::latest_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void CheckpointManager::Run() {
  // The background work yields to the training loop (bench/manager measures it); a system that refuses (a seccomp
  // filter, another OS) runs it as before.
  (void)SetThisThreadPriority(options_.background_priority);
  while (true) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Process(*job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      // A step that completed is the newest in completed_ (Prune drops the oldest), and charged_ holds what its part
      // and the replicas kept here take.
      if (!completed_.empty() && completed_.back() == job->step) {
        ++stats_.steps_completed;
        auto held = charged_.find(job->step);
        const uint64_t total = held == charged_.end() ? 0 : held->second;
        const uint64_t part = std::min(total, last_part_bytes_);
        stats_.bytes_written += part;
        stats_.bytes_replicated += total - part;
      } else {
        ++stats_.steps_failed;
      }
    }
    cv_.notify_all();
  }
}

void CheckpointManager::Process(Job& job) {
  if (job.again) return ProcessAgain(*job.again);
  const std::string what = "checkpoint manager: step " + std::to_string(job.step);
  PhaseTrace trace("rank " + std::to_string(comm_->rank()) + " step " + std::to_string(job.step));
  Status local = job.staged;
  if (job.future) {
    auto saved = job.future->Wait(std::chrono::milliseconds::max());
    if (!saved.ok()) local = saved.status().WithContext(what + ": writing the local part");
    job.future.reset();
  }
  trace.Mark("local-part");
  {
    std::lock_guard<std::mutex> lock(mu_);
    charged_[job.step] -= job.staging_charge;
    charged_total_ -= job.staging_charge;
    if (!broken_.ok()) {
      Fail(broken_);
      return;
    }
  }
  Status replicated;
  // The ranks' pieces must tile every tensor, as a collective save checks before writing (here after: the parts are
  // written each on its own): checked in full when the layout changes, by its hash otherwise.
  Status layout;
  Status collective = CheckLayout(job, &layout);
  if (!collective.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = Status(StatusCode::kPeer, what + ": checking the layout: " + collective.message());
    Fail(broken_);
    return;
  }
  if (local.ok()) local = layout;
  trace.Mark("layout");
  uint64_t held = 0;
  collective = Replicate(job, local, &replicated, &held);
  {
    // The step now holds what its part and the replicas kept here really take.
    std::lock_guard<std::mutex> lock(mu_);
    charged_total_ = charged_total_ - charged_[job.step] + held;
    charged_[job.step] = held;
  }
  if (!collective.ok()) {
    // A collective failed: the communicator is gone, and with it every later step.
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = Status(StatusCode::kPeer, what + ": replicating: " + collective.message());
    Fail(broken_);
    return;
  }
  if (local.ok() && !replicated.ok()) local = replicated.WithContext(what + ": replicating");
  trace.Mark("replicate");
  auto all = GatherStatuses(comm_, local, options_.timeout);
  trace.Mark("agree");
  if (!all.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = Status(StatusCode::kPeer, what + ": " + all.status().message());
    Fail(broken_);
    return;
  }
  Status complete = FirstFailure(all.value(), comm_->rank());
  if (!complete.ok() && complete.code() == StatusCode::kPeer)
    complete = complete.WithContext(what + " is not complete");
  if (complete.ok()) {
    complete = local_->Publish(StepDir(job.step) + "/" + CompleteName(comm_->rank()), run_, true);
  }
  if (!complete.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Fail(complete);
    }
    Prune(job.step);  // what the step left goes, as any step no longer kept
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = job.step;
    completed_.push_back(job.step);
  }
  if (job.persist && !options_.persistent_path.empty()) {
    Status outcome;
    const auto started = std::chrono::steady_clock::now();
    Status collective = Persist(job.step, &outcome);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.persist_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!collective.ok()) {
      broken_ = Status(StatusCode::kPeer, what + ": persisting: " + collective.message());
      Fail(broken_);
      return;
    }
    if (!outcome.ok()) Fail(outcome.WithContext(what + ": persisting"));
  }
  trace.Mark("persist");
  Prune(job.step);
  trace.Mark("prune");
}

Status CheckpointManager::CheckLayout(const Job& job, Status* outcome) {
  *outcome = OkStatus();
  WireWriter w;
  w.U64(Xxh3(job.layout.data(), job.layout.size()));
  w.Var(job.keep);
  std::vector<std::string> gathered;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &gathered, options_.timeout));
  std::vector<std::string> hashes;
  uint64_t keep = job.keep;
  for (size_t r = 0; r < gathered.size(); ++r) {
    WireReader rd(gathered[r]);
    uint64_t hash = 0, k = 0;
    if (!rd.U64(&hash) || !rd.Var(&k)) return Internal("malformed layout hash from rank " + std::to_string(r));
    hashes.push_back(gathered[r].substr(0, 8));
    keep = std::min(keep, k);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    keep_ = std::max<uint64_t>(1, keep);
  }
  if (hashes == checked_layouts_) return OkStatus();
  std::vector<std::string> layouts;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(job.layout, &layouts, options_.timeout));
  *outcome = CheckLayouts(layouts, "checkpoint manager: step " + std::to_string(job.step));
  if (outcome->ok()) checked_layouts_ = hashes;
  return OkStatus();
}

// Every rank streams its part's files to its targets in rounds of at most exchange_round_bytes; a receiver writes
// them under a staging name and commits the replica with a rename.
Status CheckpointManager::Replicate(const Job& job, const Status& local, Status* outcome, uint64_t* held) {
  *outcome = local;
  *held = 0;
  const int size = comm_->size(), me = comm_->rank();
  const std::string part_dir = PartDir(job.step, me);
  struct FileInfo {
    std::string name;
    uint64_t size;
  };
  std::vector<FileInfo> mine;
  Status st = local;
  if (st.ok()) {
    auto names = local_->ListDir(part_dir);
    if (!names.ok()) st = names.status();
    for (size_t i = 0; st.ok() && i < names.value().size(); ++i) {
      auto sz = local_->FileSize(part_dir + "/" + names.value()[i]);
      if (!sz.ok()) st = sz.status();
      else mine.push_back({names.value()[i], sz.value()});
    }
  }
  // The metadata goes first, so that a receiver checks every data block as it arrives (ArrivalCheck).
  std::stable_partition(mine.begin(), mine.end(), [](const FileInfo& f) { return f.name == kMetadataFileName; });
  for (const FileInfo& f : mine) *held += f.size;
  if (!mine.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    last_part_bytes_ = *held;
  }
  if (options_.replicas == 0) {
    *outcome = st;
    return OkStatus();
  }
  WireWriter w;
  w.U8(st.ok() ? 1 : 0);
  w.Var(st.ok() ? mine.size() : 0);
  for (size_t i = 0; st.ok() && i < mine.size(); ++i) {
    w.Str(mine[i].name);
    w.Var(mine[i].size);
  }
  PhaseTrace trace("rank " + std::to_string(me) + " replicating step " + std::to_string(job.step));
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  trace.Mark("file-lists");
  std::vector<std::vector<FileInfo>> files(size);
  std::vector<uint64_t> total(size, 0);
  for (int r = 0; r < size; ++r) {
    WireReader rd(all[r]);
    uint8_t ok = 0;
    uint64_t n = 0;
    if (!rd.U8(&ok) || !rd.Count(&n, 2))
      return Internal("replication: malformed file list from rank " + std::to_string(r));
    for (uint64_t i = 0; i < n; ++i) {
      FileInfo f;
      if (!rd.Str(&f.name) || !rd.Var(&f.size) || !IsValidFileName(f.name)) {
        return Internal("replication: malformed file list from rank " + std::to_string(r));
      }
      total[r] += f.size;
      files[r].push_back(f);
    }
    if (!ok) files[r].clear(), total[r] = 0;
  }
  const uint64_t rb = options_.exchange_round_bytes;
  uint64_t rounds = 0;
  for (int r = 0; r < size; ++r) {
    if (!files[r].empty()) rounds = std::max<uint64_t>(rounds, std::max<uint64_t>(1, (total[r] + rb - 1) / rb));
  }
  // Receiving side: one staging directory per source.
  struct Incoming {
    std::string final_dir, staging_dir;
    std::vector<std::unique_ptr<WritableFile>> out;
    std::vector<uint64_t> starts;  // stream offset of each file
    std::unique_ptr<ArrivalCheck> check;
    Status st;
  };
  std::map<int, Incoming> in;
  for (int src : sources_) {
    if (files[src].empty()) continue;
    Incoming& inc = in[src];
    inc.final_dir = PartDir(job.step, src);
    inc.staging_dir = StagingPath(inc.final_dir, NewNonce());
    std::vector<std::string> names;
    std::vector<uint64_t> sizes;
    for (const FileInfo& f : files[src]) names.push_back(f.name), sizes.push_back(f.size);
    inc.check = std::make_unique<ArrivalCheck>(
        "the replica of rank " + std::to_string(src) + "'s part in '" + inc.final_dir + "'", names, sizes);
    inc.st = local_->CreateDir(StepDir(job.step));
    if (inc.st.code() == StatusCode::kExists) inc.st = OkStatus();
    if (inc.st.ok()) inc.st = local_->CreateDir(inc.staging_dir);
    if (inc.st.ok())
      inc.st = local_->WriteFileDurably(inc.staging_dir + "/" + kStagingMarkerName, StagingMarkerText(inc.final_dir));
    uint64_t at = 0;
    for (const FileInfo& f : files[src]) {
      inc.starts.push_back(at);
      at += f.size;
      if (!inc.st.ok()) continue;
      auto file = local_->CreateFile(inc.staging_dir + "/" + f.name);
      if (!file.ok()) {
        inc.st = file.status();
        continue;
      }
      inc.st = file.value()->Truncate(f.size);
      inc.out.push_back(std::move(file).value());
    }
  }
  // Sending side: this rank's files, opened once.
  std::vector<std::unique_ptr<ReadableFile>> readers;
  std::vector<uint64_t> starts;
  Status send_st = st;
  if (!files[me].empty()) {
    uint64_t at = 0;
    for (const FileInfo& f : files[me]) {
      starts.push_back(at);
      at += f.size;
      auto file = local_->OpenFile(part_dir + "/" + f.name);
      if (!file.ok()) {
        send_st = file.status();
        break;
      }
      readers.push_back(std::move(file).value());
    }
  }
  // A stream's bytes [lo, hi) read from (or written to) its files.
  auto read_stream = [&](uint64_t lo, uint64_t hi, std::string* out) -> Status {
    for (size_t i = 0; i < readers.size() && lo < hi; ++i) {
      const uint64_t fs = starts[i], fe = fs + files[me][i].size;
      if (fe <= lo || fs >= hi) continue;
      const uint64_t a = std::max(lo, fs), b = std::min(hi, fe);
      DCKPT_RETURN_IF_ERROR(CopyRange(*readers[i], a - fs, b - a, out));
    }
    return OkStatus();
  };
  // Each round is received straight into one of two buffer sets (one per source, kept across rounds) and written to
  // the replicas' files by a writer beside the next round's exchange; a round's writer starts once the one before has
  // finished, so the set it reads is never the one being received into.
  trace.Mark("setup");
  std::string chunk;
  auto& received = replica_buffers_;
  std::future<void> writing[2];
  auto write_round = [&](int set, uint64_t lo) {
    const auto t_write = std::chrono::steady_clock::now();
    for (auto& [src, inc] : in) {
      if (total[src] <= lo || !inc.st.ok()) continue;
      const char* got = received[set][src].data.get();
      const uint64_t hi = std::min(total[src], lo + rb);
      for (size_t i = 0; i < inc.out.size() && inc.st.ok(); ++i) {
        const uint64_t fs = inc.starts[i], fe = fs + files[src][i].size;
        if (fe <= lo || fs >= hi) continue;
        const uint64_t a = std::max(lo, fs), b = std::min(hi, fe);
        inc.check->Feed(i, a - fs, got + (a - lo), b - a);
        inc.st = inc.out[i]->WriteAt(a - fs, got + (a - lo), b - a);
      }
    }
    trace.Add("check+write", t_write);
  };
  Status exchanged = OkStatus();
  for (uint64_t round = 0; round < rounds && exchanged.ok(); ++round) {
    const uint64_t lo = round * rb;
    const int set = static_cast<int>(round % 2);
    std::vector<std::pair<int, std::string_view>> sends;
    if (total[me] > lo) {
      const uint64_t hi = std::min(total[me], lo + rb);
      std::string_view view;
      // Bytes of one file that can be mapped go straight from the mapping (no copy); others through `chunk`.
      for (size_t i = 0; send_st.ok() && i < readers.size(); ++i) {
        const uint64_t fs = starts[i], fe = fs + files[me][i].size;
        if (lo < fs || hi > fe) continue;
        const char* base = readers[i]->Map();
        const auto t_populate = std::chrono::steady_clock::now();
        if (base && readers[i]->Populate(lo - fs, hi - lo).ok()) view = std::string_view(base + (lo - fs), hi - lo);
        trace.Add("populate", t_populate);
        break;
      }
      if (send_st.ok() && view.data() == nullptr) {
        chunk.clear();
        send_st = read_stream(lo, hi, &chunk);
        view = chunk;
      }
      // A rank that cannot read its own part sends zeros of the size announced (the step does not complete: its
      // outcome says why, and the replicas of an incomplete step are never read).
      if (!send_st.ok()) {
        chunk.assign(hi - lo, '\0');
        view = chunk;
      }
      for (int t : targets_) sends.emplace_back(t, view);
    }
    std::vector<Communicator::RecvInto> recvs;
    for (int src : sources_) {
      if (total[src] <= lo) continue;
      ReceiveBuffer& buf = received[set][src];
      const uint64_t n = std::min(total[src], lo + rb) - lo;
      if (buf.size < n) {
        buf.data.reset();
        buf.data.reset(new char[n]);  // not zeroed: every byte is received before it is read
        buf.size = n;
      }
      recvs.push_back({src, buf.data.get(), static_cast<size_t>(n)});
    }
    auto t = std::chrono::steady_clock::now();
    exchanged = comm_->SendRecvInto(sends, recvs, options_.timeout);
    trace.Add("exchange", t);
    if (!exchanged.ok()) break;
    t = std::chrono::steady_clock::now();
    if (writing[1 - set].valid()) writing[1 - set].get();  // one writer at a time (a replica's status is its own)
    trace.Add("wait-writer", t);
    writing[set] = std::async(std::launch::async, write_round, set, lo);
  }
  auto t_last = std::chrono::steady_clock::now();
  for (auto& w : writing) {
    if (w.valid()) w.get();
  }
  trace.Add("wait-writer", t_last);
  DCKPT_RETURN_IF_ERROR(exchanged);
  t_last = std::chrono::steady_clock::now();
  Status result = send_st.ok() ? OkStatus() : send_st.WithContext("sending this rank's part to its replicas");
  for (auto& [src, inc] : in) {
    if (inc.st.ok()) inc.st = inc.check->Finish();
    for (auto& f : inc.out) {
      if (inc.st.ok()) inc.st = f->Sync();
      Status closed = f->Close();
      if (inc.st.ok()) inc.st = closed;
    }
    if (inc.st.ok()) inc.st = CommitReceivedPart(local_, inc.staging_dir, inc.final_dir, StepDir(job.step));
    if (inc.st.ok()) *held += total[src];
    if (!inc.st.ok()) {
      (void)local_->RemoveAll(inc.staging_dir);
      if (result.ok()) {
        result = inc.st.WithContext("keeping the replica of rank " + std::to_string(src) + "'s part in '" +
                                    inc.final_dir + "'");
      }
    }
  }
  trace.Add("sync+commit", t_last);
  *outcome = result;
  return OkStatus();
}

// Steps this rank has finished with and that are not among the newest complete ones kept (keep_local, or fewer when
// the budget of some rank holds fewer: keep_, agreed) are removed from the node by its first rank (ranks of one node
// complete the same steps, in the same order).
void CheckpointManager::Prune(uint64_t step) {
  std::set<uint64_t> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (completed_.size() > keep_) completed_.erase(completed_.begin());
    kept.insert(completed_.begin(), completed_.end());
    // A step not kept (dropped, or one that did not complete) holds nothing of the budget once it is over.
    for (auto it = charged_.begin(); it != charged_.end();) {
      if (it->first <= step && !kept.count(it->first)) {
        charged_total_ -= it->second;
        it = charged_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int me = comm_->rank();
  if (nodes_[node_index_[me]].front() != me) return;
  auto names = local_->ListDir(options_.local_dir);
  if (!names.ok()) return;
  for (const std::string& n : names.value()) {
    uint64_t s;
    if (!ParseNumbered(n, "step-", 10, &s) || s > step || kept.count(s)) continue;
    const std::string dir = options_.local_dir + "/" + n;
    auto inside = local_->ListDir(dir);
    if (!inside.ok()) continue;
    for (const std::string& f : inside.value()) {
      uint64_t r;
      if (ParseNumbered(f, "complete-", 5, &r)) (void)local_->RemoveAll(dir + "/" + f);
    }
    for (const std::string& f : inside.value()) {
      uint64_t r;
      std::string final_name;
      if (ParseNumbered(f, "part-", 5, &r)) (void)RemoveCheckpoint(local_, dir + "/" + f);
      else if (ParseStagingName(f, &final_name)) (void)local_->RemoveAll(dir + "/" + f);
    }
    (void)local_->RemoveEmptyDir(dir);
  }
}

}  // namespace distckpt
