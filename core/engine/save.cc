#include "core/engine/save.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/base/thread_pool.h"
#include "core/base/version.h"
#include "core/base/wire.h"
#include "core/codec/block_codec.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/incremental.h"
#include "core/engine/save_compressed.h"
#include "core/engine/save_staging.h"
#include "core/format/checksum.h"
#include "core/plan/plan_codec.h"
#include "core/plan/save_planner.h"

namespace distckpt {

Status CheckCompression(Codec codec, int level, const std::string& where) {
  if (codec != Codec::kRaw && codec != Codec::kZstdGrouped) {
    return InvalidArgument(where + ": unknown compression " + std::to_string(static_cast<int>(codec)));
  }
  if (codec != Codec::kRaw && (level < MinCompressionLevel() || level > MaxCompressionLevel())) {
    return InvalidArgument(where + ": compression level " + std::to_string(level) + " is outside zstd's [" +
                           std::to_string(MinCompressionLevel()) + ", " + std::to_string(MaxCompressionLevel()) + "]");
  }
  return OkStatus();
}

size_t DefaultIoThreads() {
  size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::min<size_t>(16, std::max<size_t>(4, 2 * hw));
}

namespace {

// Large chunks are written in segments of this size so that several threads write (and hash) one chunk at once.
constexpr uint64_t kWriteSegmentBytes = 8ull << 20;

LocalPlan MakeLocalPlan(const State& state, uint32_t rank) {
  LocalPlan plan;
  plan.rank = rank;
  plan.tensors.reserve(state.tensors().size());
  for (const TensorEntry& t : state.tensors()) {
    LocalTensorDecl decl;
    decl.name = t.name;
    decl.dtype = t.dtype;
    decl.shape = t.shape;
    decl.boxes.reserve(t.pieces.size());
    for (const TensorPiece& p : t.pieces) decl.boxes.push_back(p.box);
    plan.tensors.push_back(std::move(decl));
  }
  for (const BytesEntry& b : state.bytes()) plan.bytes.push_back(LocalBytesDecl{b.name, b.size});
  return plan;
}

// Incremental saves: the chunk hash of every host piece with bytes (device pieces stay unknown, and are written),
// its blocks hashed in parallel on `pool`.
Status Fingerprint(const State& state, uint64_t block, ThreadPool* pool, LocalPlan* plan) {
  struct Job {
    const char* data;
    uint64_t length;
    ChunkFingerprint* out;
    std::vector<ChunkHash> blocks;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < state.tensors().size(); ++i) {
    const TensorEntry& t = state.tensors()[i];
    plan->tensors[i].fingerprints.resize(t.pieces.size());
    for (size_t k = 0; k < t.pieces.size(); ++k) {
      const TensorPiece& p = t.pieces[k];
      const uint64_t length = p.box.volume() * DTypeSize(t.dtype);
      if (length == 0 || !p.memory.is_host()) continue;
      jobs.push_back(Job{static_cast<const char*>(p.data), length, &plan->tensors[i].fingerprints[k], {}});
    }
  }
  for (size_t i = 0; i < state.bytes().size(); ++i) {
    const BytesEntry& b = state.bytes()[i];
    if (b.size != 0) jobs.push_back(Job{static_cast<const char*>(b.data), b.size, &plan->bytes[i].fingerprint, {}});
  }
  const uint64_t per_task = std::max<uint64_t>(1, kWriteSegmentBytes / block);  // blocks a task hashes
  TaskGroup group(pool);
  for (Job& job : jobs) {
    const uint64_t n = NumChecksumBlocks(job.length, block);
    job.blocks.resize(n);
    for (uint64_t first = 0; first < n; first += per_task) {
      group.Run([&job, first, n, per_task, block]() -> Status {
        for (uint64_t b = first; b < std::min(n, first + per_task); ++b) {
          const uint64_t begin = b * block;
          job.blocks[b] = Xxh3_128(job.data + begin, std::min(block, job.length - begin));
        }
        return OkStatus();
      });
    }
  }
  DCKPT_RETURN_IF_ERROR(group.Wait());
  for (Job& job : jobs) {
    job.out->known = true;
    job.out->hash = CombineBlockHashes(Span<const ChunkHash>(job.blocks.data(), job.blocks.size()));
  }
  return OkStatus();
}

// The coordinator's answer to the planning round: a status, the staging nonce, and every rank's assignment.
Result<std::string> EncodePlanReply(const Status& status, const std::string& nonce, const GlobalPlan* plan) {
  WireWriter w;
  PutStatus(&w, status);
  if (!status.ok()) return w.Take();
  w.Str(nonce);
  w.Var(plan->per_rank.size());
  for (uint32_t r = 0; r < plan->per_rank.size(); ++r) {
    DCKPT_ASSIGN_OR_RETURN(RankAssignment a, GetRankAssignment(*plan, r));
    DCKPT_ASSIGN_OR_RETURN(std::string encoded, EncodeRankAssignment(a));
    w.Str(encoded);
  }
  return w.Take();
}

// Decodes the coordinator's reply, keeping only this rank's assignment.
Status DecodePlanReply(const std::string& msg, int rank, std::string* nonce, RankAssignment* mine) {
  WireReader r(msg);
  Status status;
  if (!GetStatus(&r, &status)) return Internal("malformed plan message from rank 0");
  if (!status.ok()) return status;
  uint64_t nranks;
  if (!r.Str(nonce) || !r.Count(&nranks) || static_cast<uint64_t>(rank) >= nranks) {
    return Internal("malformed plan message from rank 0");
  }
  std::string encoded;
  for (uint64_t i = 0; i <= static_cast<uint64_t>(rank); ++i) {
    if (!r.Str(&encoded)) return Internal("malformed plan message from rank 0");
  }
  DCKPT_ASSIGN_OR_RETURN(*mine, DecodeRankAssignment(encoded));
  return OkStatus();
}

// Where a task's bytes are: host memory, or a device piece (staged through pinned memory).
struct TaskSource {
  const void* data = nullptr;
  const TensorEntry* tensor = nullptr;
  const TensorPiece* piece = nullptr;
  size_t width = 1;  // the element width compression groups bytes by
  bool device() const { return piece != nullptr && !piece->memory.is_host(); }
};

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Writes this rank's chunks into its data file in the staging directory, hashing as it goes.
Status WriteAssignment(Storage* storage, const StagedCheckpoint& staged, const State& state,
                       const RankAssignment& assignment, const SaveOptions& options, ThreadPool* pool,
                       std::vector<ChunkChecksums>* reports, uint64_t* bytes_written) {
  if (assignment.tasks.empty()) return OkStatus();
  // Which of this rank's declarations each entry index refers to.
  std::unordered_map<uint32_t, const TensorEntry*> tensor_decl;
  std::unordered_map<uint32_t, const BytesEntry*> bytes_decl;
  for (size_t i = 0; i < assignment.tensor_entry.size(); ++i) {
    tensor_decl[assignment.tensor_entry[i]] = &state.tensors()[i];
  }
  for (size_t i = 0; i < assignment.bytes_entry.size(); ++i) bytes_decl[assignment.bytes_entry[i]] = &state.bytes()[i];
  const size_t n = assignment.tasks.size();
  std::vector<TaskSource> sources(n);
  for (size_t i = 0; i < n; ++i) {
    const WriteTask& t = assignment.tasks[i];
    TaskSource& src = sources[i];
    if (t.length == 0) {
      // Nothing to write (an empty tensor's single chunk): no piece needs to back it.
    } else if (auto it = tensor_decl.find(t.entry); it != tensor_decl.end()) {
      if (t.local >= it->second->pieces.size()) return Internal("the plan names a piece this rank does not hold");
      src.tensor = it->second;
      src.piece = &src.tensor->pieces[t.local];
      src.data = src.piece->data;
      src.width = GroupWidth(DTypeSize(src.tensor->dtype));
    } else if (auto jt = bytes_decl.find(t.entry); jt != bytes_decl.end()) {
      src.data = jt->second->data;
    } else {
      return Internal("the plan assigns entry #" + std::to_string(t.entry) + " to a rank that does not hold it");
    }
  }

  // A compressed save lays the file out itself: the chunks written raw (device pieces) first, at aligned offsets,
  // then the compressed stream; every byte up to the end is written, padding included.
  const bool compress = options.compression != Codec::kRaw;
  std::vector<WriteTask> tasks = assignment.tasks;
  std::vector<CompressedChunk> compressed;
  uint64_t raw_end = 0;
  if (compress) {
    for (size_t i = 0; i < n; ++i) {
      WriteTask& t = tasks[i];
      if (t.length != 0 && !sources[i].device()) {
        compressed.push_back(CompressedChunk{i, static_cast<const char*>(sources[i].data), t.length, sources[i].width});
        continue;
      }
      t.offset = t.length == 0 ? 0 : AlignUp(raw_end, kChunkAlignment);
      raw_end = t.length == 0 ? raw_end : t.offset + t.length;
    }
  }
  uint64_t file_size = 0;
  for (const WriteTask& t : tasks) file_size = std::max(file_size, t.offset + t.length);

  const std::string file_path = staged.StagingFile(staged.FileName(DataFileName(assignment.rank)));
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, storage->CreateFile(file_path));
  if (compress) {
    // The gaps between the raw chunks, and up to the compressed stream.
    uint64_t end = 0;
    std::vector<std::pair<uint64_t, uint64_t>> raw;
    for (const WriteTask& t : tasks) {
      if (t.length != 0 && sources[&t - tasks.data()].device()) raw.emplace_back(t.offset, t.length);
    }
    std::sort(raw.begin(), raw.end());
    const uint64_t stream = compressed.empty() ? raw_end : AlignUp(raw_end, kChunkAlignment);
    for (const auto& [offset, length] : raw) {
      DCKPT_RETURN_IF_ERROR(WriteZeros(file.get(), end, offset));
      end = offset + length;
    }
    DCKPT_RETURN_IF_ERROR(WriteZeros(file.get(), end, stream));
    raw_end = stream;
  } else {
    DCKPT_RETURN_IF_ERROR(file->Preallocate(file_size));
    // The padding between chunks is never written: storage that uploads in parts must not wait for it.
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    ranges.reserve(n);
    for (const WriteTask& t : tasks) ranges.emplace_back(t.offset, t.length);
    file->ExpectWrites(ranges);
  }

  const uint64_t block = options.checksum_block_size;
  const uint64_t segment = std::max<uint64_t>(block, kWriteSegmentBytes / block * block);
  reports->assign(n, ChunkChecksums{});
  std::vector<uint64_t> single(n, 0);
  std::vector<std::vector<ChunkHash>> block_hashes(n);  // the chunk hash's blocks (FORMAT.md 5.1)
  uint64_t total = 0;
  for (const WriteTask& t : tasks) total += t.length;
  std::atomic<uint64_t> done{0};
  std::mutex progress_mu;
  auto report_progress = [&](uint64_t len) -> Status {
    if (options.progress) {
      std::lock_guard<std::mutex> lock(progress_mu);  // before counting: `now` grows call after call
      const uint64_t now = done.fetch_add(len) + len;
      if (options.progress(now, total) != 0) return Status(StatusCode::kUser, "aborted by the progress callback");
    }
    return OkStatus();
  };
  // Hashes the checksum blocks of bytes [seg, seg + seg_len) of task i (held at `bytes`), writes them, reports
  // progress. Segments start on block boundaries, so each block is hashed by exactly one segment.
  auto hash_and_write = [&](size_t i, const char* bytes, uint64_t seg, uint64_t seg_len) -> Status {
    const WriteTask& t = tasks[i];
    const uint64_t nblocks = NumChecksumBlocks(t.length, block);
    for (uint64_t off = seg; off < seg + seg_len; off += block) {
      if (options.chunk_hashes) {
        block_hashes[i][off / block] = Xxh3_128(bytes + (off - seg), std::min(block, t.length - off));
      }
      uint64_t h = Xxh3(bytes + (off - seg), std::min(block, t.length - off));
      if (nblocks > 1) {
        (*reports)[i].blocks[off / block] = h;
      } else {
        single[i] = h;
      }
    }
    DCKPT_RETURN_IF_ERROR(file->WriteAt(t.offset + seg, bytes, seg_len));
    return report_progress(seg_len);
  };
  // Device pieces go through the staging pipeline (save_staging.h); device_task[k] is the task of device_copies[k].
  std::vector<DeviceCopy> device_copies;
  std::vector<size_t> device_task;
  const StagedConsumer write_staged = [&](size_t k, uint64_t off, const char* bytes, uint64_t len) {
    return hash_and_write(device_task[k], bytes, off, len);
  };
  size_t next_compressed = 0;
  TaskGroup group(pool);
  for (size_t i = 0; i < n; ++i) {
    const WriteTask& t = tasks[i];
    const TaskSource& src = sources[i];
    const uint64_t nblocks = NumChecksumBlocks(t.length, block);
    ChunkChecksums& report = (*reports)[i];
    report.entry = t.entry;
    report.chunk = t.chunk;
    report.placed = compress;
    report.offset = t.offset;
    if (nblocks > 1) report.blocks.assign(nblocks, 0);
    block_hashes[i].resize(nblocks);
    if (t.length == 0) {
      single[i] = Xxh3(nullptr, 0);
      block_hashes[i][0] = Xxh3_128(nullptr, 0);
      continue;
    }
    if (src.device()) {
      device_copies.push_back(DeviceCopy{src.data, t.length, src.piece->memory,
                                         "tensor '" + src.tensor->name + "' piece " + src.piece->box.ToString()});
      device_task.push_back(i);
      continue;
    }
    if (next_compressed < compressed.size() && compressed[next_compressed].task == i) {
      report.stored.resize(nblocks);
      ++next_compressed;
      continue;
    }
    for (uint64_t seg = 0; seg < t.length; seg += segment) {
      const uint64_t seg_len = std::min(segment, t.length - seg);
      group.Run([&, i, seg, seg_len, data = src.data]() -> Status {
        return hash_and_write(i, static_cast<const char*>(data) + seg, seg, seg_len);
      });
    }
  }
  if (!device_copies.empty()) {
    // Host chunks are already queued; the device ones stream through the pinned pool alongside them.
    auto res = GetStagingResources(options, block);
    Status st = res.ok() ? RunStagingPipeline(*res, device_copies, &group, write_staged)
                         : res.status().WithContext(device_copies.front().what);
    if (!st.ok()) group.Run([st] { return st; });  // fails the group: queued segments are skipped
  }
  if (!compressed.empty()) {
    CompressedWriteOptions copts;
    copts.block_size = block;
    copts.level = options.compression_level;
    copts.chunk_hashes = options.chunk_hashes;
    copts.progress = report_progress;
    auto end = WriteCompressedChunks(file.get(), raw_end, compressed, copts, pool,
                                     ChunkHashSinks{reports, &single, &block_hashes});
    if (!end.ok()) {
      Status st = end.status();
      group.Run([st] { return st; });
    } else {
      file_size = *end;
    }
  }
  DCKPT_RETURN_IF_ERROR(group.Wait());
  for (size_t i = 0; i < n; ++i) {
    ChunkChecksums& report = (*reports)[i];
    report.checksum = report.blocks.empty() ? single[i] : CombineBlockChecksums(report.blocks);
    report.has_hash = options.chunk_hashes;
    if (options.chunk_hashes) {
      report.hash = CombineBlockHashes(Span<const ChunkHash>(block_hashes[i].data(), block_hashes[i].size()));
    }
    *bytes_written += report.coding.raw() ? tasks[i].length : report.coding.stored_length;
  }
  if (compress) {
    for (ChunkChecksums& report : *reports) report.file_size = file_size;
  }
  DCKPT_RETURN_IF_ERROR(file->Truncate(file_size));
  if (options.sync) DCKPT_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

std::string EncodeFinal(const Status& status, const SaveSummary& s) {
  WireWriter w;
  PutStatus(&w, status);
  w.Var(s.total_bytes);
  w.Var(s.num_files);
  w.Var(s.num_entries);
  w.Var(s.metadata_bytes);
  w.Var(s.bytes_reused);
  return w.Take();
}

// Rank 0's side of the planning round: decode every local plan, plan globally, create the staging directory.
Status PlanOnCoordinator(const std::string& path, const SaveOptions& options, Storage* storage,
                         std::vector<std::string>& hellos, std::optional<GlobalPlan>* plan,
                         std::optional<StagedCheckpoint>* staged, std::string* nonce,
                         std::unique_ptr<IncrementalBase>* incremental) {
  std::vector<LocalPlan> plans(hellos.size());
  for (size_t r = 0; r < hellos.size(); ++r) {
    auto decoded = DecodeLocalPlan(hellos[r]);
    if (!decoded.ok()) return decoded.status().WithContext("rank " + std::to_string(r));
    plans[r] = std::move(decoded).value();
  }
  SavePlanOptions popts;
  popts.checksum_block_size = options.checksum_block_size;
  if (!options.base.empty()) {
    DCKPT_ASSIGN_OR_RETURN(*incremental, IncrementalBase::Open(storage, path, options.base, options.full_every));
    popts.reuse = (*incremental)->Reuse(popts.checksum_block_size, popts.alignment);
  }
  DCKPT_ASSIGN_OR_RETURN(*plan, MakeGlobalPlan(plans, popts));
  if (*incremental) (*incremental)->Finish(&(*plan)->metadata);
  // An overwrite must not pull the files from under the incremental checkpoints that refer to this one.
  if (options.overwrite) DCKPT_RETURN_IF_ERROR(CheckNoDependents(storage, path, "overwriting"));
  // StagedCheckpoint::Create refuses an overwrite of anything but a checkpoint or an empty directory.
  *nonce = NewNonce();
  DCKPT_ASSIGN_OR_RETURN(*staged, StagedCheckpoint::Create(storage, path, *nonce, options.overwrite));
  // Under the metadata-last protocol data files carry the save's nonce (FORMAT.md section 6.2); a base's keep theirs.
  for (DataFileRecord& f : (*plan)->metadata.files) {
    if (f.base == 0) f.name = (*staged)->FileName(f.name);
  }
  return OkStatus();
}

// Rank 0's side of the commit round: every rank's checksums -> metadata -> commit. Fills the summary.
Status CommitOnCoordinator(const State& state, Storage* storage, std::vector<std::string>& reports_in, GlobalPlan* plan,
                           StagedCheckpoint* staged, std::chrono::milliseconds timeout,
                           const IncrementalBase* incremental, SaveSummary* summary) {
  std::vector<ChunkChecksums> all = std::move(plan->reused);
  for (size_t r = 0; r < reports_in.size(); ++r) {
    Status peer;
    DCKPT_RETURN_IF_ERROR(DecodeChunkReports(reports_in[r], &peer, &all).WithContext("rank " + std::to_string(r)));
    if (!peer.ok()) return peer;
  }
  DCKPT_RETURN_IF_ERROR(FinalizeChecksums(all, plan));
  for (const EntryRecord& e : plan->metadata.entries) {
    for (const ChunkLocation& c : e.chunks) summary->total_bytes += c.length;
  }
  summary->num_files = static_cast<uint32_t>(plan->metadata.files.size());
  summary->num_entries = static_cast<uint32_t>(plan->metadata.entries.size());
  plan->metadata.writer = kWriterName;
  for (const auto& kv : state.user()) plan->metadata.user.emplace_back(kv.first, kv.second);
  plan->metadata.structure = state.structure();
  DCKPT_ASSIGN_OR_RETURN(std::string encoded, EncodeMetadata(std::move(plan->metadata)));
  summary->metadata_bytes = encoded.size();
  if (incremental != nullptr) {
    summary->bytes_reused = incremental->bytes_reused();
    DCKPT_RETURN_IF_ERROR(incremental->CheckUnchanged(storage));
  }
  // Another save committing into the same directory holds its lock for milliseconds; wait well inside the time the
  // other ranks wait for this round.
  return staged->CommitWithMetadata(encoded,
                                    std::min<std::chrono::milliseconds>(timeout / 2, std::chrono::seconds(60)));
}

}  // namespace

namespace {

Result<SaveSummary> SaveImpl(const std::string& path, const State& state, Communicator* comm,
                             const SaveOptions& options, const Status& failed_before);

}  // namespace

Result<SaveSummary> Save(const std::string& path, const State& state, Communicator* comm, const SaveOptions& options) {
  return SaveImpl(path, state, comm, options, OkStatus());
}

Status JoinSaveAsFailed(const std::string& path, Communicator* comm, const SaveOptions& options, const Status& why) {
  if (why.ok()) return InvalidArgument("JoinSaveAsFailed: no failure to report");
  const State nothing;
  auto r = SaveImpl(path, nothing, comm, options, why);
  return r.ok() ? Internal("saving '" + path + "': the save went on although this rank failed") : r.status();
}

namespace {

// `failed_before`: this rank failed before the save (SaveAsync's staging): it sends that error in round 1.
Result<SaveSummary> SaveImpl(const std::string& path, const State& state, Communicator* comm,
                             const SaveOptions& options, const Status& failed_before) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Communicator> single;
  if (comm == nullptr) {
    single = NewSingleProcessCommunicator();
    comm = single.get();
  }
  Storage* storage = options.storage ? options.storage : DefaultStorage();
  const int rank = comm->rank();
  const std::string where = "saving '" + path + "'";
  if (options.checksum_block_size < 4096 || (options.checksum_block_size & (options.checksum_block_size - 1))) {
    return InvalidArgument(where + ": checksum_block_size must be a power of two >= 4096");
  }
  DCKPT_RETURN_IF_ERROR(CheckCompression(options.compression, options.compression_level, where));

  // Round 1: every rank sends its local plan; the coordinator plans globally, creates the staging directory and
  // answers with the nonce and every rank's chunks. Coordinator state lives only on rank 0.
  ThreadPool pool(options.io_threads ? options.io_threads : DefaultIoThreads());
  Result<std::string> local =
      failed_before.ok() ? Result<std::string>(std::string()) : Result<std::string>(failed_before);
  if (failed_before.ok()) {
    LocalPlan mine = MakeLocalPlan(state, static_cast<uint32_t>(rank));
    Status hashed = options.base.empty() ? OkStatus() : Fingerprint(state, options.checksum_block_size, &pool, &mine);
    local = hashed.ok() ? EncodeLocalPlan(mine) : Result<std::string>(hashed);
  }
  std::optional<GlobalPlan> plan;
  std::optional<StagedCheckpoint> staged;
  std::unique_ptr<IncrementalBase> incremental;  // rank 0, with options.base
  auto abort_staging = [&] {
    if (staged && rank == 0) (void)staged->Abort();
  };
  auto reply = CoordinatorRound(
      comm, local.status().WithContext("rank " + std::to_string(rank)), local.ok() ? *local : std::string(),
      options.timeout, [&](std::vector<std::string>& hellos) {
        std::string nonce;
        Status st = PlanOnCoordinator(path, options, storage, hellos, &plan, &staged, &nonce, &incremental);
        auto encoded = EncodePlanReply(st, nonce, st.ok() ? &*plan : nullptr);
        if (encoded.ok()) return std::move(encoded).value();
        abort_staging();
        staged.reset();
        return EncodePlanReply(encoded.status(), "", nullptr).value();
      });
  if (!reply.ok()) {
    abort_staging();
    return reply.status().WithContext(where);
  }
  std::string nonce;
  RankAssignment mine;
  Status planned = DecodePlanReply(*reply, rank, &nonce, &mine);
  if (!planned.ok()) {
    abort_staging();
    return planned.WithContext(where);
  }
  if (!staged) staged = StagedCheckpoint::Join(storage, path, nonce, options.overwrite);

  // Round 2: every rank writes and fsyncs its chunks, then reports checksums; the coordinator commits only if every
  // rank reported durable success, and answers with the outcome.
  std::vector<ChunkChecksums> reports;
  uint64_t bytes_written = 0;
  Status write_status;
  write_status = WriteAssignment(storage, *staged, state, mine, options, &pool, &reports, &bytes_written);
  if (!write_status.ok()) write_status = write_status.WithContext("rank " + std::to_string(rank));
  SaveSummary summary;
  summary.path = path;
  auto final_msg = CoordinatorRound(comm, write_status, EncodeChunkReports(OkStatus(), reports, bytes_written),
                                    options.timeout, [&](std::vector<std::string>& reports_in) {
                                      Status st = CommitOnCoordinator(state, storage, reports_in, &*plan, &*staged,
                                                                      options.timeout, incremental.get(), &summary);
                                      if (!st.ok()) abort_staging();
                                      return EncodeFinal(st, summary);
                                    });
  if (!final_msg.ok()) {
    abort_staging();
    return final_msg.status().WithContext(where);
  }
  WireReader in(*final_msg);
  Status final_status;
  uint64_t nfiles = 0, nentries = 0;
  if (!GetStatus(&in, &final_status) || !in.Var(&summary.total_bytes) || !in.Var(&nfiles) || !in.Var(&nentries) ||
      !in.Var(&summary.metadata_bytes) || !in.Var(&summary.bytes_reused)) {
    return Internal(where + ": malformed commit message from rank 0");
  }
  if (!final_status.ok()) return final_status.WithContext(where);
  summary.num_files = static_cast<uint32_t>(nfiles);
  summary.num_entries = static_cast<uint32_t>(nentries);
  summary.bytes_written = bytes_written;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace

}  // namespace distckpt
