#include "core/manager/manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/base/box.h"
#include "core/base/wire.h"
#include "core/engine/load.h"
#include "core/format/metadata.h"
#include "core/manager/exchange.h"
#include "core/manager/part.h"
#include "core/tools/leftovers.h"

namespace distckpt {
namespace {

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

uint64_t StateBytes(const State& state) {
  uint64_t total = 0;
  for (const TensorEntry& t : state.tensors()) {
    for (const TensorPiece& p : t.pieces) total += p.box.volume() * DTypeSize(t.dtype);
  }
  for (const BytesEntry& b : state.bytes()) total += b.size;
  return total;
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

// The first failure among the ranks' statuses, as this rank reports it.
Status FirstFailure(const std::vector<Status>& all, int me, const std::string& what) {
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

// Row-major byte span [lo, hi) of `inner` inside a chunk holding `outer` (inner lies inside outer).
std::pair<uint64_t, uint64_t> ByteSpan(const Box& outer, const Box& inner, uint64_t itemsize) {
  uint64_t lo = 0, hi = 0;
  for (uint32_t d = 0; d < outer.ndim; ++d) {
    lo = lo * outer.length[d] + (inner.offset[d] - outer.offset[d]);
    hi = hi * outer.length[d] + (inner.end(d) - 1 - outer.offset[d]);
  }
  return {lo * itemsize, (hi + 1) * itemsize};
}

}  // namespace

struct CheckpointManager::Job {
  uint64_t step = 0;
  bool persist = false;
  std::unique_ptr<SaveFuture> future;
  Status staged;
  uint64_t staging_charge = 0;  // bytes of the budget held until the part is written
};

CheckpointManager::CheckpointManager(Communicator* comm, const ManagerOptions& options)
    : comm_(comm), options_(options), local_(DefaultStorage()) {}

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::Create(Communicator* comm,
                                                                     const ManagerOptions& options) {
  if (options.local_dir.empty()) return InvalidArgument("checkpoint manager: no local directory");
  if (options.node_id.empty()) return InvalidArgument("checkpoint manager: no node id");
  if (options.replicas < 0 || options.replicas > 2) {
    return InvalidArgument("checkpoint manager: replicas must be 0, 1 or 2, not " + std::to_string(options.replicas));
  }
  if (options.keep_local < 1) return InvalidArgument("checkpoint manager: keep_local must be at least 1");
  if (options.exchange_round_bytes == 0) return InvalidArgument("checkpoint manager: exchange_round_bytes is 0");
  std::unique_ptr<CheckpointManager> m(new CheckpointManager(comm, options));
  if (!comm) {
    m->single_ = NewSingleProcessCommunicator();
    m->comm_ = m->single_.get();
  }
  Communicator* c = m->comm_;
  const int size = c->size(), me = c->rank();
  m->persistent_ = options.persistent_storage ? options.persistent_storage.get() : DefaultStorage();

  // Node ids and the run id (rank 0's nonce) in one AllGather; a rank whose local directory is unusable says so.
  Status local = m->local_->CreateDir(options.local_dir);
  if (local.code() == StatusCode::kExists) local = OkStatus();
  if (local.ok()) {
    auto is_dir = m->local_->IsDirectory(options.local_dir);
    if (!is_dir.ok()) local = is_dir.status();
    else if (!is_dir.value()) local = InvalidArgument("'" + options.local_dir + "' is not a directory");
  }
  if (!local.ok()) local = local.WithContext("checkpoint manager: local directory");
  WireWriter w;
  w.Str(options.node_id);
  w.Str(NewNonce());
  w.Str(EncodeStatus(local));
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(c->AllGather(w.Take(), &all, options.timeout));
  std::vector<Status> statuses;
  std::set<std::string> ids;
  for (int r = 0; r < size; ++r) {
    WireReader rd(all[r]);
    std::string node, nonce, st;
    if (!rd.Str(&node) || !rd.Str(&nonce) || !rd.Str(&st)) return Internal("checkpoint manager: malformed hello");
    WireReader sr(st);
    statuses.push_back(DecodeStatus(sr));
    m->node_of_.push_back(node);
    ids.insert(node);
    if (r == 0) m->run_ = nonce;
  }
  DCKPT_RETURN_IF_ERROR(FirstFailure(statuses, me, "checkpoint manager"));
  std::vector<std::string> sorted(ids.begin(), ids.end());
  m->nodes_.resize(sorted.size());
  m->node_index_.resize(size);
  for (int r = 0; r < size; ++r) {
    int n = static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), m->node_of_[r]) - sorted.begin());
    m->node_index_[r] = n;
    m->nodes_[n].push_back(r);
  }
  const int nodes = static_cast<int>(sorted.size());
  if (options.replicas >= nodes) {
    return InvalidArgument("checkpoint manager: " + std::to_string(options.replicas) +
                           " replicas need as many other nodes, but the job has " + std::to_string(nodes) +
                           " node(s) (node ids: " + std::string(sorted.size() > 0 ? sorted[0] : "") +
                           (sorted.size() > 1 ? ", ..." : "") + ")");
  }
  // Replica k of rank r goes to the node k places after r's, to the rank with r's place on its own node.
  m->targets_of_.resize(size);
  for (int r = 0; r < size; ++r) {
    const int n = m->node_index_[r];
    const auto& mine = m->nodes_[n];
    const size_t local_index = std::find(mine.begin(), mine.end(), r) - mine.begin();
    for (int k = 1; k <= options.replicas; ++k) {
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

void CheckpointManager::Fail(const Status& st) {
  if (error_.ok()) error_ = st;
}

Status CheckpointManager::Save(uint64_t step, const State& state, bool persist) {
  const uint64_t bytes = StateBytes(state);
  const uint64_t tier_charge = bytes * (1 + static_cast<uint64_t>(options_.replicas));
  const uint64_t charge = tier_charge + bytes;  // the tier's copies and the staging until the part is written
  {
    std::unique_lock<std::mutex> lock(mu_);
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
      const uint64_t steady = tier_charge * static_cast<uint64_t>(options_.keep_local) + charge;
      if (steady > budget) {
        return InvalidArgument("checkpoint manager: step " + std::to_string(step) + " of " + std::to_string(bytes) +
                               " bytes on rank " + std::to_string(comm_->rank()) + " needs " + std::to_string(steady) +
                               " bytes of the local tier (" + std::to_string(options_.keep_local) +
                               " kept step(s) and one in flight, each with " + std::to_string(options_.replicas) +
                               " replica(s) of another rank's part, plus the staging), more than "
                               "local_budget_bytes (" +
                               std::to_string(budget) + ")");
      }
      // Back-pressure: wait for steps in flight (each completion drops the steps no longer kept).
      const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
      while (charged_total_ + charge > budget && (busy_ || !queue_.empty())) {
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
          return TimeoutError("checkpoint manager: step " + std::to_string(step) +
                              " waited for the local tier's budget past the timeout");
        }
        if (!broken_.ok()) return broken_;
      }
    }
    last_saved_ = step;
    charged_[step] += charge;
    charged_total_ += charge;
  }
  auto job = std::make_unique<Job>();
  job->step = step;
  job->persist = persist || (options_.persist_every && step % options_.persist_every == 0);
  job->staging_charge = bytes;
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

Status CheckpointManager::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !busy_; })) {
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
    }
    cv_.notify_all();
  }
}

void CheckpointManager::Process(Job& job) {
  const std::string what = "checkpoint manager: step " + std::to_string(job.step);
  Status local = job.staged;
  if (job.future) {
    auto saved = job.future->Wait(std::chrono::milliseconds::max());
    if (!saved.ok()) local = saved.status().WithContext(what + ": writing the local part");
    job.future.reset();
  }
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
  Status collective = Replicate(job, local, &replicated);
  if (!collective.ok()) {
    // A collective failed: the communicator is gone, and with it every later step.
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = Status(StatusCode::kPeer, what + ": replicating: " + collective.message());
    Fail(broken_);
    return;
  }
  if (local.ok()) local = replicated;
  auto all = AgreeAll(comm_, local, options_.timeout);
  if (!all.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = Status(StatusCode::kPeer, what + ": " + all.status().message());
    Fail(broken_);
    return;
  }
  Status complete = FirstFailure(all.value(), comm_->rank(), what + " is not complete");
  if (complete.ok()) {
    complete = local_->Publish(StepDir(job.step) + "/" + CompleteName(comm_->rank()), run_, true);
  }
  if (!complete.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    Fail(complete.WithContext(what));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = job.step;
    completed_.push_back(job.step);
  }
  if (job.persist && !options_.persistent_path.empty()) {
    Status outcome;
    Status collective = Persist(job.step, &outcome);
    std::lock_guard<std::mutex> lock(mu_);
    if (!collective.ok()) {
      broken_ = Status(StatusCode::kPeer, what + ": persisting: " + collective.message());
      Fail(broken_);
      return;
    }
    if (!outcome.ok()) Fail(outcome.WithContext(what + ": persisting"));
  }
  Prune(job.step);
}

// Every rank streams its part's files to its targets in rounds of at most exchange_round_bytes; a receiver writes
// them under a staging name and commits the replica with a rename.
Status CheckpointManager::Replicate(const Job& job, const Status& local, Status* outcome) {
  *outcome = local;
  const int size = comm_->size(), me = comm_->rank();
  const std::string part_dir = PartDir(job.step, me);
  struct FileInfo {
    std::string name;
    uint64_t size;
  };
  std::vector<FileInfo> mine;
  Status st = local;
  if (st.ok() && options_.replicas > 0) {
    auto names = local_->ListDir(part_dir);
    if (!names.ok()) st = names.status();
    for (size_t i = 0; st.ok() && i < names.value().size(); ++i) {
      auto sz = local_->FileSize(part_dir + "/" + names.value()[i]);
      if (!sz.ok()) st = sz.status();
      else mine.push_back({names.value()[i], sz.value()});
    }
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
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
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
    Status st;
  };
  std::map<int, Incoming> in;
  for (int src : sources_) {
    if (files[src].empty()) continue;
    Incoming& inc = in[src];
    inc.final_dir = PartDir(job.step, src);
    inc.staging_dir = StagingPath(inc.final_dir, NewNonce());
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
  for (uint64_t round = 0; round < rounds; ++round) {
    std::vector<int> receivers;
    for (int q = 0; q < size; ++q) {
      for (int r = 0; r < size; ++r) {
        if (total[r] > round * rb && std::count(targets_of_[r].begin(), targets_of_[r].end(), q)) {
          receivers.push_back(q);
          break;
        }
      }
    }
    std::map<int, std::string> sends;
    if (total[me] > round * rb) {
      std::string chunk;
      const uint64_t lo = round * rb, hi = std::min(total[me], lo + rb);
      if (send_st.ok()) send_st = read_stream(lo, hi, &chunk);
      // A rank that cannot read its own part sends nothing; its receivers see a short stream and say so.
      if (send_st.ok()) {
        for (int t : targets_) sends[t] = chunk;
      }
    }
    std::map<int, std::string> received;
    DCKPT_RETURN_IF_ERROR(Exchange(comm_, receivers, sends, &received, options_.timeout));
    for (auto& [src, inc] : in) {
      if (total[src] <= round * rb || !inc.st.ok()) continue;
      auto it = received.find(src);
      const uint64_t lo = round * rb, hi = std::min(total[src], lo + rb);
      if (it == received.end() || it->second.size() != hi - lo) {
        inc.st = IoError("rank " + std::to_string(src) + " did not send its part (it could not read it)");
        continue;
      }
      for (size_t i = 0; i < inc.out.size() && inc.st.ok(); ++i) {
        const uint64_t fs = inc.starts[i], fe = fs + files[src][i].size;
        if (fe <= lo || fs >= hi) continue;
        const uint64_t a = std::max(lo, fs), b = std::min(hi, fe);
        inc.st = inc.out[i]->WriteAt(a - fs, it->second.data() + (a - lo), b - a);
      }
    }
  }
  Status result = send_st.ok() ? OkStatus() : send_st.WithContext("sending this rank's part to its replicas");
  for (auto& [src, inc] : in) {
    for (auto& f : inc.out) {
      if (inc.st.ok()) inc.st = f->Sync();
      Status closed = f->Close();
      if (inc.st.ok()) inc.st = closed;
    }
    if (inc.st.ok()) inc.st = local_->RemoveAll(inc.staging_dir + "/" + kStagingMarkerName);
    if (inc.st.ok()) inc.st = local_->SyncDir(inc.staging_dir);
    if (inc.st.ok()) {
      // A replica of an earlier run of this step is replaced.
      Status gone = local_->RemoveAll(inc.final_dir);
      inc.st = gone.ok() ? local_->Rename(inc.staging_dir, inc.final_dir) : gone;
    }
    if (inc.st.ok()) inc.st = local_->SyncDir(StepDir(job.step));
    if (!inc.st.ok()) {
      (void)local_->RemoveAll(inc.staging_dir);
      if (result.ok()) {
        result = inc.st.WithContext("keeping the replica of rank " + std::to_string(src) + "'s part in '" +
                                    inc.final_dir + "'");
      }
    }
  }
  *outcome = result;
  return OkStatus();
}

// Rank 0 creates the staging checkpoint; every rank copies its part's data files into it; rank 0 merges the parts'
// metadata and commits. The persisted step is one ordinary checkpoint.
Status CheckpointManager::Persist(uint64_t step, Status* outcome) {
  const int me = comm_->rank(), size = comm_->size();
  const std::string path = options_.persistent_path + "/" + StepName(step);
  std::string hello;
  std::optional<StagedCheckpoint> staged;
  if (me == 0) {
    const std::string nonce = NewNonce();
    auto created = StagedCheckpoint::Create(persistent_, path, nonce, /*overwrite=*/true);
    WireWriter w;
    w.Str(EncodeStatus(created.ok() ? OkStatus() : created.status()));
    w.Str(nonce);
    hello = w.Take();
    if (created.ok()) staged.emplace(std::move(created).value());
  }
  DCKPT_RETURN_IF_ERROR(comm_->Broadcast(&hello, 0, options_.timeout));
  WireReader hr(hello);
  std::string st_text, nonce;
  if (!hr.Str(&st_text) || !hr.Str(&nonce)) return Internal("persist: malformed message from rank 0");
  WireReader sr(st_text);
  Status st = DecodeStatus(sr);
  if (!st.ok()) {
    *outcome = me == 0 ? st : Status(StatusCode::kPeer, "rank 0 could not start '" + path + "': " + st.message());
    return OkStatus();
  }
  if (me != 0) staged.emplace(StagedCheckpoint::Join(persistent_, path, nonce, true));
  // This rank's files.
  const std::string part_dir = PartDir(step, me);
  std::string metadata;
  auto meta = local_->ReadFile(part_dir + "/" + kMetadataFileName, kMaxMetadataBytes);
  if (!meta.ok()) st = meta.status();
  else metadata = meta.value();
  Result<Part> part = st.ok() ? ParsePart(metadata, part_dir) : Result<Part>(st);
  if (!part.ok()) st = part.status();
  std::vector<char> buf;
  for (size_t i = 0; st.ok() && i < part.value().record.files.size(); ++i) {
    const DataFileRecord& f = part.value().record.files[i];
    auto in = local_->OpenFile(part_dir + "/" + f.name);
    if (!in.ok()) {
      st = in.status();
      break;
    }
    auto out = persistent_->CreateFile(staged->StagingFile(staged->FileName(PartFileName(me, f.name))));
    if (!out.ok()) {
      st = out.status();
      break;
    }
    buf.resize(std::min<uint64_t>(f.size, 16ull << 20));
    for (uint64_t at = 0; st.ok() && at < f.size; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), f.size - at));
      st = in.value()->ReadAt(at, buf.data(), n);
      if (st.ok()) st = out.value()->WriteAt(at, buf.data(), n);
    }
    if (st.ok()) st = out.value()->Sync();
    Status closed = out.value()->Close();
    if (st.ok()) st = closed;
  }
  WireWriter w;
  w.Str(EncodeStatus(st));
  w.Str(st.ok() ? metadata : std::string());
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->Gather(w.Take(), 0, &all, options_.timeout));
  std::string verdict;
  if (me == 0) {
    std::vector<Status> statuses;
    std::vector<Part> parts;
    for (int r = 0; r < size; ++r) {
      WireReader rd(all[r]);
      std::string s, m;
      if (!rd.Str(&s) || !rd.Str(&m)) return Internal("persist: malformed message from rank " + std::to_string(r));
      WireReader ssr(s);
      statuses.push_back(DecodeStatus(ssr));
      if (statuses.back().ok()) {
        auto p = ParsePart(m, PartDir(step, r));
        if (!p.ok()) statuses.back() = p.status();
        else parts.push_back(std::move(p).value());
      }
    }
    Status result = FirstFailure(statuses, me, "persisting '" + path + "'");
    if (result.ok()) {
      const StagedCheckpoint& sc = *staged;
      auto merged = MergeParts(parts, path, [&](const std::string& name) { return sc.FileName(name); });
      result = merged.ok() ? staged->CommitWithMetadata(merged.value()) : merged.status();
    }
    if (!result.ok()) (void)staged->Abort();
    verdict = EncodeStatus(result);
  }
  DCKPT_RETURN_IF_ERROR(comm_->Broadcast(&verdict, 0, options_.timeout));
  WireReader vr(verdict);
  Status result = DecodeStatus(vr);
  if (!result.ok() && me != 0 && result.code() != StatusCode::kPeer) {
    result = Status(StatusCode::kPeer, "persisting '" + path + "' failed on rank 0: " + result.message());
  }
  *outcome = result;
  if (result.ok() && me == 0 && options_.keep_persistent > 0) {
    // Older persisted steps beyond keep_persistent go; only names this manager writes are touched.
    auto names = persistent_->ListDir(options_.persistent_path);
    if (names.ok()) {
      std::vector<uint64_t> steps;
      for (const std::string& n : names.value()) {
        uint64_t s;
        if (ParseNumbered(n, "step-", 10, &s) && s <= step) steps.push_back(s);
      }
      std::sort(steps.begin(), steps.end());
      const size_t keep = static_cast<size_t>(options_.keep_persistent);
      for (size_t i = 0; i + keep < steps.size(); ++i) {
        (void)RemoveCheckpoint(persistent_, options_.persistent_path + "/" + StepName(steps[i]));
      }
    }
  }
  return OkStatus();
}

// Steps this rank has finished with and that are not among the newest keep_local complete ones are removed from the
// node by its first rank (ranks of one node complete the same steps, in the same order).
void CheckpointManager::Prune(uint64_t step) {
  std::vector<uint64_t> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (completed_.size() > static_cast<size_t>(options_.keep_local)) {
      drop.push_back(completed_.front());
      completed_.erase(completed_.begin());
    }
    // A step that did not complete holds nothing of the budget once it is over.
    for (auto it = charged_.begin(); it != charged_.end();) {
      const bool kept = std::count(completed_.begin(), completed_.end(), it->first) > 0;
      if (it->first <= step && !kept) {
        charged_total_ -= it->second;
        it = charged_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int me = comm_->rank();
  if (nodes_[node_index_[me]].front() != me) return;
  std::set<uint64_t> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept.insert(completed_.begin(), completed_.end());
  }
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

struct CheckpointManager::Inventory {
  struct Held {
    uint64_t step = 0;
    std::string run;
    uint32_t rank = 0, ranks = 0;
  };
  std::vector<std::vector<Held>> parts;                                // per rank: its node's parts
  std::vector<std::vector<std::pair<uint64_t, std::string>>> markers;  // per rank: (step, run) complete
  std::vector<uint64_t> persisted;                                     // committed steps (rank 0 looked)
};

Result<CheckpointManager::Inventory> CheckpointManager::TakeInventory(bool use_persistent) {
  const int size = comm_->size();
  WireWriter w;
  std::vector<Inventory::Held> held;
  std::vector<std::pair<uint64_t, std::string>> markers;
  auto names = local_->ListDir(options_.local_dir);
  if (names.ok()) {
    for (const std::string& n : names.value()) {
      uint64_t step;
      if (!ParseNumbered(n, "step-", 10, &step)) continue;
      const std::string dir = options_.local_dir + "/" + n;
      auto inside = local_->ListDir(dir);
      if (!inside.ok()) continue;
      for (const std::string& f : inside.value()) {
        uint64_t r;
        if (ParseNumbered(f, "complete-", 5, &r)) {
          auto run = local_->ReadFile(dir + "/" + f, 64);
          if (run.ok()) markers.emplace_back(step, run.value());
        } else if (ParseNumbered(f, "part-", 5, &r)) {
          // What the part says it is; a part whose metadata is unreadable is not held (verification reports why).
          auto bytes = local_->ReadFile(dir + "/" + f + "/" + kMetadataFileName, kMaxMetadataBytes);
          if (!bytes.ok()) continue;
          auto view = MetadataView::Parse(std::make_shared<const std::string>(std::move(bytes).value()), dir + "/" + f);
          if (!view.ok()) continue;
          auto info = PartInfoOf(view.value(), dir + "/" + f);
          auto run = view.value().FindUser("dckpt.run");
          if (!info.ok() || !run || info.value().step != step || info.value().rank != r) continue;
          held.push_back({step, std::string(*run), info.value().rank, info.value().ranks});
        }
      }
    }
  }
  std::vector<uint64_t> persisted;
  if (use_persistent && comm_->rank() == 0) {
    auto listed = persistent_->ListDir(options_.persistent_path);
    if (listed.ok()) {
      for (const std::string& n : listed.value()) {
        uint64_t step;
        if (!ParseNumbered(n, "step-", 10, &step)) continue;
        auto there = persistent_->Exists(options_.persistent_path + "/" + n + "/" + kMetadataFileName);
        if (there.ok() && there.value()) persisted.push_back(step);
      }
    }
  }
  w.Var(held.size());
  for (const auto& h : held) {
    w.Var(h.step);
    w.Str(h.run);
    w.Var(h.rank);
    w.Var(h.ranks);
  }
  w.Var(markers.size());
  for (const auto& m : markers) {
    w.Var(m.first);
    w.Str(m.second);
  }
  w.Var(persisted.size());
  for (uint64_t s : persisted) w.Var(s);
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  Inventory inv;
  inv.parts.resize(size);
  inv.markers.resize(size);
  for (int r = 0; r < size; ++r) {
    WireReader rd(all[r]);
    uint64_t n = 0;
    bool ok = rd.Count(&n, 4);
    for (uint64_t i = 0; ok && i < n; ++i) {
      Inventory::Held h;
      uint64_t rank = 0, ranks = 0;
      ok = rd.Var(&h.step) && rd.Str(&h.run) && rd.Var(&rank) && rd.Var(&ranks) && rank < ranks && ranks < (1u << 24);
      h.rank = static_cast<uint32_t>(rank);
      h.ranks = static_cast<uint32_t>(ranks);
      if (ok) inv.parts[r].push_back(h);
    }
    ok = ok && rd.Count(&n, 2);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t step = 0;
      std::string run;
      ok = rd.Var(&step) && rd.Str(&run);
      if (ok) inv.markers[r].emplace_back(step, run);
    }
    ok = ok && rd.Count(&n, 1);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t step = 0;
      ok = rd.Var(&step);
      if (ok && r == 0) inv.persisted.push_back(step);
    }
    if (!ok) return Internal("restore: malformed inventory from rank " + std::to_string(r));
  }
  return inv;
}

Result<RestoreSummary> CheckpointManager::Restore(State& state, const RestoreOptions& ro) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    if (!broken_.ok()) return broken_;
  }
  report_.clear();
  auto note = [&](const std::string& line) { report_ += line + "\n"; };
  const int me = comm_->rank(), size = comm_->size();
  const bool use_persistent = ro.use_persistent && !options_.persistent_path.empty();
  DCKPT_ASSIGN_OR_RETURN(Inventory inv, TakeInventory(use_persistent));
  std::map<uint64_t, std::set<std::string>> complete;
  for (const auto& list : inv.markers) {
    for (const auto& m : list) complete[m.first].insert(m.second);
  }
  std::set<uint64_t, std::greater<uint64_t>> steps(inv.persisted.begin(), inv.persisted.end());
  for (const auto& kv : complete) steps.insert(kv.first);
  RestoreSummary summary;
  bool newest = true;
  std::string missing_newest;
  for (uint64_t step : steps) {
    const std::string what = "step " + std::to_string(step);
    for (const std::string& run : complete.count(step) ? complete[step] : std::set<std::string>{}) {
      // Which ranks' nodes hold each part of this step of this run.
      uint32_t ranks = 0;
      for (const auto& list : inv.parts) {
        for (const auto& h : list) {
          if (h.step == step && h.run == run) ranks = std::max(ranks, h.ranks);
        }
      }
      std::vector<std::vector<int>> holders(ranks);
      for (int r = 0; r < size; ++r) {
        for (const auto& h : inv.parts[r]) {
          if (h.step == step && h.run == run && h.ranks == ranks) holders[h.rank].push_back(r);
        }
      }
      std::string missing;
      for (uint32_t p = 0; p < ranks; ++p) {
        if (holders[p].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      }
      if (ranks == 0 || !missing.empty()) {
        note(what + ": not restorable from the local tiers: the parts of rank(s) " + (missing.empty() ? "?" : missing) +
             " (of " + std::to_string(ranks) + ") are on no live node");
        if (newest)
          missing_newest =
              what + ": the parts of rank(s) " + missing + " of " + std::to_string(ranks) + " are on no live node";
        continue;
      }
      // Verification: for each part, one rank of each node that holds it reads and checks it.
      std::vector<uint32_t> assigned;
      for (uint32_t p = 0; p < ranks; ++p) {
        std::map<int, std::vector<int>> by_node;
        for (int r : holders[p]) by_node[node_index_[r]].push_back(r);
        for (const auto& kv : by_node) {
          if (kv.second[p % kv.second.size()] == me) assigned.push_back(p);
        }
      }
      WireWriter w;
      w.Var(assigned.size());
      for (uint32_t p : assigned) {
        const std::string dir = PartDir(step, p);
        Status st = OkStatus();
        std::string meta;
        auto bytes = local_->ReadFile(dir + "/" + kMetadataFileName, kMaxMetadataBytes);
        if (!bytes.ok()) st = bytes.status();
        else meta = bytes.value();
        if (st.ok()) {
          auto part = ParsePart(meta, dir);
          if (!part.ok()) st = part.status();
          else if (part.value().info.step != step || part.value().info.rank != p || part.value().info.ranks != ranks)
            st = Corrupt(dir + ": the part is not rank " + std::to_string(p) + "'s of " + what);
        }
        if (st.ok()) {
          ReadOptions opts;
          opts.storage = local_;
          opts.share_verification = false;
          auto reader = Reader::Open(dir, nullptr, opts);
          st = reader.ok() ? reader.value()->VerifyAll(nullptr) : reader.status();
        }
        w.Var(p);
        w.Str(EncodeStatus(st));
        w.Str(st.ok() ? meta : std::string());
      }
      std::vector<std::string> all;
      DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
      std::vector<std::vector<int>> good(ranks);
      std::vector<std::string> metadata(ranks);
      for (int r = 0; r < size; ++r) {
        WireReader rd(all[r]);
        uint64_t n = 0;
        bool ok = rd.Count(&n, 3);
        for (uint64_t i = 0; ok && i < n; ++i) {
          uint64_t p = 0;
          std::string st_text, meta;
          ok = rd.Var(&p) && rd.Str(&st_text) && rd.Str(&meta) && p < ranks;
          if (!ok) break;
          WireReader sr(st_text);
          Status st = DecodeStatus(sr);
          const std::string node = node_of_[r];
          if (!st.ok()) {
            note(what + ": skipped the copy of rank " + std::to_string(p) + "'s part on node '" + node +
                 "' (verified by rank " + std::to_string(r) + "): " + st.message());
            continue;
          }
          if (metadata[p].empty()) metadata[p] = meta;
          for (int h : holders[p]) {
            if (node_index_[h] == node_index_[r]) good[p].push_back(h);
          }
        }
        if (!ok) return Internal("restore: malformed verification message from rank " + std::to_string(r));
      }
      missing.clear();
      for (uint32_t p = 0; p < ranks; ++p) {
        if (good[p].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      }
      if (!missing.empty()) {
        note(what + ": not restorable from the local tiers: no copy of the parts of rank(s) " + missing + " verifies");
        if (newest)
          missing_newest =
              what + ": no copy of the parts of rank(s) " + missing + " of " + std::to_string(ranks) + " verifies";
        continue;
      }
      for (auto& g : good) std::sort(g.begin(), g.end());
      summary.step = step;
      Status st = RestoreFromParts(state, step, metadata, good, &summary);
      if (!st.ok()) return st;
      summary.found = true;
      summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return summary;
    }
    if (std::count(inv.persisted.begin(), inv.persisted.end(), step)) {
      const std::string path = options_.persistent_path + "/" + StepName(step);
      ReadOptions opts;
      opts.storage = persistent_;
      opts.timeout = options_.timeout;
      opts.copy_engine = options_.copy_engine;
      auto loaded = Load(path, state, comm_, opts);
      if (!loaded.ok()) return loaded.status().WithContext("restoring " + what + " from persistent storage");
      note(what + ": loaded from persistent storage '" + path + "'");
      summary.found = true;
      summary.step = step;
      summary.tier = Tier::kPersistent;
      summary.bytes_from_persistent = loaded.value().io.bytes_read + loaded.value().io.bytes_mapped;
      summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return summary;
    }
    if (newest && !ro.fallback) {
      return NotFound("restore: the newest complete " + missing_newest +
                      " (and it was not persisted); fallback to an older step is off");
    }
    newest = false;
  }
  note("nothing to restore: no complete step in any tier");
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

// Each rank builds a checkpoint of the step in a scratch directory of its node: the merged metadata, hard links to
// the data files of parts its node holds, and sparse files holding the byte ranges it needs of the others, fetched
// from a node that holds them. Then it loads from there (verifying every byte it reads), and the ranks agree.
Status CheckpointManager::RestoreFromParts(State& state, uint64_t step, const std::vector<std::string>& part_metadata,
                                           const std::vector<std::vector<int>>& good_holders, RestoreSummary* summary) {
  const int me = comm_->rank(), size = comm_->size();
  const int my_node = node_index_[me];
  const std::string what = "step " + std::to_string(step);
  const uint32_t ranks = static_cast<uint32_t>(part_metadata.size());
  const std::string scratch = options_.local_dir + "/restore-r" + std::to_string(me) + "." + NewNonce();
  Status st = OkStatus();
  std::vector<Part> parts;
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    auto part = ParsePart(part_metadata[p], PartDir(step, p));
    if (!part.ok()) st = part.status();
    else parts.push_back(std::move(part).value());
  }
  std::string merged;
  if (st.ok()) {
    auto m = MergeParts(parts, options_.local_dir + "/" + StepName(step));
    if (!m.ok()) st = m.status();
    else merged = std::move(m).value();
  }
  // Which part and file each merged data file is.
  std::vector<std::pair<uint32_t, std::string>> file_of;
  std::vector<bool> here(ranks, false);
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    for (const auto& f : parts[p].record.files) file_of.emplace_back(p, f.name);
    for (int h : good_holders[p]) here[p] = here[p] || node_index_[h] == my_node;
  }
  if (st.ok()) st = local_->CreateDir(scratch);
  if (st.ok()) st = local_->WriteFileDurably(scratch + "/" + kMetadataFileName, merged);
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    for (const auto& f : parts[p].record.files) {
      const std::string dst = scratch + "/" + PartFileName(p, f.name);
      if (here[p]) {
        // linkat without AT_SYMLINK_FOLLOW: a planted link is linked as a link, and the reader refuses it.
        const std::string src = PartDir(step, p) + "/" + f.name;
        if (::linkat(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), 0) != 0) {
          st = ErrnoError(errno, "linking '" + src + "' to '" + dst + "'");
          break;
        }
      } else {
        auto out = local_->CreateFile(dst);
        st = out.ok() ? out.value()->Truncate(f.size) : out.status();
        if (st.ok()) st = out.value()->Close();
        if (!st.ok()) break;
      }
    }
  }
  // The byte ranges this rank needs of parts its node lacks: for each chunk that meets one of its pieces, the span
  // of the chunk that holds the overlap, widened to whole checksum blocks (what a verified read hashes).
  struct Need {
    uint32_t part;
    std::string file;
    uint64_t lo, hi;
  };
  std::vector<Need> needs;
  if (st.ok()) {
    auto view = MetadataView::Parse(std::make_shared<const std::string>(merged), scratch);
    if (!view.ok()) st = view.status();
    const uint64_t bs = st.ok() ? view.value().checksum_block_size() : 1;
    auto need_chunk = [&](const EntryView& e, size_t c, uint64_t lo, uint64_t hi) {
      const ChunkLocation loc = e.chunk(c);
      const auto& [p, name] = file_of.at(loc.file);
      if (here[p]) return;
      if (loc.first_block != kNoBlockTable) {
        lo = lo / bs * bs;
        hi = std::min(loc.length, (hi + bs - 1) / bs * bs);
      } else {
        lo = 0, hi = loc.length;
      }
      if (hi > lo) needs.push_back({p, name, loc.offset + lo, loc.offset + hi});
    };
    for (const TensorEntry& t : state.tensors()) {
      if (!st.ok()) break;
      auto idx = view.value().Find(t.name);
      if (!idx) continue;  // the load names it
      EntryView e = view.value().entry(*idx);
      if (e.kind != EntryKind::kTensor || e.dtype != t.dtype) continue;
      for (size_t c = 0; c < e.num_chunks; ++c) {
        const Box chunk = e.chunk_box(c);
        for (const TensorPiece& piece : t.pieces) {
          Box overlap;
          if (piece.box.ndim != chunk.ndim || !Intersect(chunk, piece.box, &overlap) || overlap.volume() == 0) continue;
          auto [lo, hi] = ByteSpan(chunk, overlap, DTypeSize(t.dtype));
          need_chunk(e, c, lo, hi);
        }
      }
    }
    for (const BytesEntry& b : state.bytes()) {
      if (!st.ok()) break;
      auto idx = view.value().Find(b.name);
      if (!idx || view.value().entry(*idx).kind != EntryKind::kBytes) continue;
      EntryView e = view.value().entry(*idx);
      need_chunk(e, 0, 0, e.chunk(0).length);
    }
  }
  std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) {
    return std::tie(a.part, a.file, a.lo) < std::tie(b.part, b.file, b.lo);
  });
  std::vector<Need> merged_needs;
  for (const Need& n : needs) {
    if (!merged_needs.empty() && merged_needs.back().part == n.part && merged_needs.back().file == n.file &&
        n.lo <= merged_needs.back().hi) {
      merged_needs.back().hi = std::max(merged_needs.back().hi, n.hi);
    } else {
      merged_needs.push_back(n);
    }
  }
  // Requests to servers: for a part, one of the nodes that hold a good copy, spread by the requester's rank.
  WireWriter w;
  w.Str(EncodeStatus(st));
  w.Var(st.ok() ? merged_needs.size() : 0);
  for (size_t i = 0; st.ok() && i < merged_needs.size(); ++i) {
    const Need& n = merged_needs[i];
    const auto& g = good_holders[n.part];
    w.Var(static_cast<uint64_t>(g[static_cast<size_t>(me) % g.size()]));
    w.Var(n.part);
    w.Str(n.file);
    w.Var(n.lo);
    w.Var(n.hi);
  }
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  struct Request {
    uint32_t part;
    std::string file;
    uint64_t lo, hi;
  };
  std::map<std::pair<int, int>, std::vector<Request>> pairs;  // (server, requester) -> ranges, in order
  std::vector<Status> prepared(size);
  for (int q = 0; q < size; ++q) {
    WireReader rd(all[q]);
    std::string st_text;
    uint64_t n = 0;
    bool ok = rd.Str(&st_text);
    WireReader sr(st_text);
    if (ok) prepared[q] = DecodeStatus(sr);
    ok = ok && rd.Count(&n, 5);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t server = 0, part = 0;
      Request r;
      ok = rd.Var(&server) && rd.Var(&part) && rd.Str(&r.file) && rd.Var(&r.lo) && rd.Var(&r.hi) &&
           server < static_cast<uint64_t>(size) && part < ranks && r.hi >= r.lo && IsValidFileName(r.file);
      r.part = static_cast<uint32_t>(part);
      if (ok) pairs[{static_cast<int>(server), q}].push_back(r);
    }
    if (!ok) return Internal("restore: malformed request from rank " + std::to_string(q));
  }
  // Serving: the files asked of this rank, opened once.
  std::map<std::string, std::unique_ptr<ReadableFile>> open;
  Status serve_st = OkStatus();
  auto stream_total = [](const std::vector<Request>& v) {
    uint64_t t = 0;
    for (const Request& r : v) t += r.hi - r.lo;
    return t;
  };
  const uint64_t rb = options_.exchange_round_bytes;
  uint64_t rounds = 0;
  for (const auto& kv : pairs) rounds = std::max(rounds, (stream_total(kv.second) + rb - 1) / rb);
  auto stream_io = [&](const std::vector<Request>& v, uint64_t lo, uint64_t hi,
                       const std::function<Status(const Request&, uint64_t, uint64_t, uint64_t)>& each) -> Status {
    uint64_t at = 0;
    for (const Request& r : v) {
      const uint64_t rs = at, re = at + (r.hi - r.lo);
      at = re;
      if (re <= lo || rs >= hi) continue;
      const uint64_t a = std::max(lo, rs), b = std::min(hi, re);
      DCKPT_RETURN_IF_ERROR(each(r, r.lo + (a - rs), b - a, a - lo));
    }
    return OkStatus();
  };
  std::map<std::string, std::unique_ptr<WritableFile>> fetched;
  uint64_t from_peers = 0;
  for (uint64_t round = 0; round < rounds; ++round) {
    std::set<int> receivers;
    for (const auto& kv : pairs) {
      if (stream_total(kv.second) > round * rb) receivers.insert(kv.first.second);
    }
    std::map<int, std::string> sends;
    for (const auto& kv : pairs) {
      if (kv.first.first != me) continue;
      const uint64_t total = stream_total(kv.second), lo = round * rb, hi = std::min(total, lo + rb);
      if (total <= lo) continue;
      std::string chunk;
      if (serve_st.ok()) {
        serve_st = stream_io(kv.second, lo, hi, [&](const Request& r, uint64_t off, uint64_t n, uint64_t) -> Status {
          const std::string path = PartDir(step, r.part) + "/" + r.file;
          auto& f = open[path];
          if (!f) {
            DCKPT_ASSIGN_OR_RETURN(f, local_->OpenFile(path));
          }
          return CopyRange(*f, off, n, &chunk);
        });
      }
      if (serve_st.ok()) sends[kv.first.second] = std::move(chunk);
    }
    std::map<int, std::string> received;
    DCKPT_RETURN_IF_ERROR(
        Exchange(comm_, std::vector<int>(receivers.begin(), receivers.end()), sends, &received, options_.timeout));
    for (const auto& kv : pairs) {
      if (kv.first.second != me || !st.ok()) continue;
      const int server = kv.first.first;
      const uint64_t total = stream_total(kv.second), lo = round * rb, hi = std::min(total, lo + rb);
      if (total <= lo) continue;
      auto it = received.find(server);
      if (it == received.end() || it->second.size() != hi - lo) {
        st = IoError("rank " + std::to_string(server) + " on node '" + node_of_[server] +
                     "' did not send the bytes asked of it");
        continue;
      }
      from_peers += hi - lo;
      st = stream_io(kv.second, lo, hi, [&](const Request& r, uint64_t off, uint64_t n, uint64_t at) -> Status {
        const std::string path = scratch + "/" + PartFileName(r.part, r.file);
        auto& f = fetched[path];
        if (!f) {
          DCKPT_ASSIGN_OR_RETURN(f, local_->CreateFile(path));
          // CreateFile truncates: give the file its size back (the holes are never read).
          const uint64_t size_of = [&] {
            for (const auto& df : parts[r.part].record.files) {
              if (df.name == r.file) return df.size;
            }
            return uint64_t{0};
          }();
          DCKPT_RETURN_IF_ERROR(f->Truncate(size_of));
        }
        return f->WriteAt(off, it->second.data() + at, n);
      });
    }
  }
  for (auto& kv : fetched) {
    Status closed = kv.second->Close();
    if (st.ok()) st = closed;
  }
  if (st.ok() && !serve_st.ok()) st = serve_st.WithContext("serving other ranks' restore");
  if (st.ok()) {
    for (int q = 0; q < size; ++q) {
      if (!prepared[q].ok() && q != me)
        st = Status(StatusCode::kPeer, "rank " + std::to_string(q) + ": " + prepared[q].message());
    }
  }
  IoStats io;
  if (st.ok()) {
    ReadOptions opts;
    opts.storage = local_;
    opts.copy_engine = options_.copy_engine;
    opts.share_verification = false;
    auto loaded = Load(scratch, state, nullptr, opts);
    if (!loaded.ok()) st = loaded.status();
    else io = loaded.value().io;
  }
  (void)local_->RemoveAll(scratch);
  DCKPT_ASSIGN_OR_RETURN(std::vector<Status> outcome, AgreeAll(comm_, st, options_.timeout));
  DCKPT_RETURN_IF_ERROR(FirstFailure(outcome, me, "restoring " + what).WithContext("restore"));
  summary->bytes_from_peers = from_peers;
  const uint64_t read = io.bytes_read + io.bytes_mapped;
  summary->bytes_local = read > from_peers ? read - from_peers : 0;
  summary->tier = from_peers ? Tier::kPeer : Tier::kLocal;
  std::string served;
  for (uint32_t p = 0; p < ranks; ++p) {
    const auto& g = good_holders[p];
    served += (p ? ", " : "") + std::to_string(p) +
              (here[p] ? " here" : " from node '" + node_of_[g[static_cast<size_t>(me) % g.size()]] + "'");
  }
  report_ += what + ": restored on rank " + std::to_string(me) + " (node '" + node_of_[me] + "') from the parts of " +
             std::to_string(ranks) + " rank(s): " + served + "; " + std::to_string(from_peers) + " bytes from peers\n";
  return OkStatus();
}

}  // namespace distckpt
