// Reader and ReadBatch: opening a checkpoint (its directory, metadata and data files, collectively or not), the
// per-entry requests (regions, bytes entries, verification, mapping) and the files and indexes the executor reads
// through. The reads themselves run in read_executor.cc.
#include "core/engine/reader.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/base/wire.h"
#include "core/engine/base_checkpoint.h"
#include "core/engine/read_executor.h"
#include "core/engine/save.h"
#include "core/foreign/foreign.h"
#include "core/foreign/hub_cache.h"

namespace distckpt {

Reader::Reader(std::string path, std::string dir_path, MetadataView meta, const ReadOptions& options,
               std::unique_ptr<Directory> dir)
    : path_(std::move(path)),
      dir_path_(std::move(dir_path)),
      meta_(std::move(meta)),
      options_(options),
      dir_(std::move(dir)) {
  storage_ = options.storage ? options.storage : DefaultStorage();
  // A foreign checkpoint carries no checksums: there is nothing to verify (VerifyAll says so).
  if (!meta_.checksummed()) options_.verify = false;
  files_.resize(meta_.num_files());
  file_errors_.resize(meta_.num_files());
  indexes_.resize(meta_.num_entries());
}

Reader::~Reader() = default;

namespace {

// The checkpoint's directory. A missing one, or a path that is not a directory, is "does not exist".
Result<std::unique_ptr<Directory>> OpenCheckpointDirectory(Storage* storage, const std::string& path) {
  auto dir = storage->OpenDirectory(path);
  if (dir.status().code() == StatusCode::kNotFound) {
    return NotFound("checkpoint '" + path + "' does not exist (" + dir.status().message() + ")");
  }
  return dir;
}

// A rank other than 0 of a collective open: its own view of the directory must hold the metadata file rank 0 read
// (same size, same last 16 bytes: for format 1.1 the checksum of the whole file). Otherwise the checkpoint was
// replaced between rank 0's read and this rank's open, and this rank would pin another checkpoint's data files.
Status CheckSameMetadata(Directory* dir, const std::string& path, const std::string& broadcast) {
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, OpenMetadataFile(dir, path));
  const size_t tail = std::min<size_t>(broadcast.size(), kMetadataTrailerBytes);
  std::string mine(tail, '\0');
  if (file->size() == broadcast.size()) DCKPT_RETURN_IF_ERROR(file->ReadAt(file->size() - tail, mine.data(), tail));
  if (file->size() != broadcast.size() || mine != broadcast.substr(broadcast.size() - tail)) {
    return Status(StatusCode::kState, "checkpoint '" + path + "' changed while it was being opened: this rank's " +
                                          kMetadataFileName + " differs from the one rank 0 read (the checkpoint " +
                                          "was overwritten or replaced meanwhile); open it again");
  }
  return OkStatus();
}

// What a reader reads a checkpoint through: the bytes of its metadata file (mapped or read), or the encoded
// description of a foreign checkpoint (then `owner` is a std::string).
struct Description {
  std::shared_ptr<const void> owner;
  const char* data = nullptr;
  size_t size = 0;
  bool foreign = false;
};

// A directory without metadata.dckpt (nor a STAGING marker) in a Hugging Face hub cache is read where the cache
// keeps its files (core/foreign/hub_cache.h): a snapshot through its links into blobs/, a repository at refs/main's
// snapshot (`*dir_path` becomes the snapshot's). A distckpt checkpoint's own files are never read through links.
// Only foreign checkpoints get here, so opening a distckpt one costs nothing more (on S3, no request more).
Status ResolveInPlace(Storage* storage, const std::string& path, std::unique_ptr<Directory>* dir,
                      std::string* dir_path) {
  DCKPT_ASSIGN_OR_RETURN(bool has_metadata, (*dir)->Exists(kMetadataFileName));
  DCKPT_ASSIGN_OR_RETURN(bool staging, (*dir)->Exists(kStagingMarkerName));
  if (has_metadata || staging) return OkStatus();
  return ResolveHubCache(dir, dir_path, path, storage);
}

// The metadata of the checkpoint at `path` (directory `dir`), or of the one safetensors file `single_file` in it.
// A foreign checkpoint's directory may be replaced (`*dir`, `*dir_path`: ResolveInPlace).
Result<Description> ReadDescription(Storage* storage, std::unique_ptr<Directory>* dir_holder, const std::string& path,
                                    std::string* dir_path, const std::string& single_file, bool map) {
  Description d;
  std::optional<MetadataRecord> foreign;
  Directory* dir = dir_holder->get();
  if (!single_file.empty()) {
    DCKPT_RETURN_IF_ERROR(ResolveInPlace(storage, path, dir_holder, dir_path));
    DCKPT_ASSIGN_OR_RETURN(MetadataRecord record,
                           DescribeSafetensorsFile(dir_holder->get(), *dir_path, single_file, path));
    foreign = std::move(record);
  } else {
    auto file = OpenMetadataFile(dir, path);
    if (file.ok()) {
      // One process: map the metadata file instead of copying it into fresh memory (at 1M chunks, 63 MiB: the copy
      // and the page faults of the new buffer cost more than verifying and validating it; bench/NOTES.md).
      if (map && (*file)->Map() != nullptr) {
        d.data = (*file)->Map();
        d.size = static_cast<size_t>((*file)->size());
        d.owner = std::shared_ptr<const ReadableFile>(std::move(file).value());
      } else {
        DCKPT_ASSIGN_OR_RETURN(std::string read, ReadWhole(**file));
        auto bytes = std::make_shared<std::string>(std::move(read));
        d.data = bytes->data();
        d.size = bytes->size();
        d.owner = std::move(bytes);
      }
      return d;
    }
    auto staging = dir->Exists(kStagingMarkerName);
    if (file.status().code() != StatusCode::kNotFound || (staging.ok() && *staging)) return file.status();
    DCKPT_RETURN_IF_ERROR(ResolveHubCache(dir_holder, dir_path, path, storage));  // no metadata.dckpt, no STAGING
    DCKPT_ASSIGN_OR_RETURN(foreign, DescribeForeignDirectory(storage, dir_holder->get(), *dir_path, path));
    if (!foreign) {
      return NotFound("'" + path + "' is not a checkpoint: it has no " + kMetadataFileName +
                      ", and it is not a safetensors or PyTorch DCP checkpoint either");
    }
  }
  const std::string source = foreign->source;
  auto encoded = EncodeMetadata(std::move(*foreign));
  if (!encoded.ok()) {
    return Corrupt("checkpoint '" + path + "' (" + source + "): " + encoded.status().message());
  }
  auto bytes = std::make_shared<std::string>(std::move(encoded).value());
  d.data = bytes->data();
  d.size = bytes->size();
  d.owner = std::move(bytes);
  d.foreign = true;
  return d;
}

}  // namespace

Result<std::unique_ptr<Reader>> Reader::Open(const std::string& path, Communicator* comm, const ReadOptions& options,
                                             FilePinning pinning) {
  Storage* storage = options.storage ? options.storage : DefaultStorage();
  // A path naming one safetensors file (or index) is read in place: its directory is opened, and only that file
  // (and the shards the index names) read.
  std::string dir_path = path, single_file;
  if (IsSafetensorsFilePath(path)) {
    auto is_dir = storage->IsDirectory(path);
    if (is_dir.ok() && !*is_dir) {
      const size_t slash = path.find_last_of('/');
      dir_path = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
      single_file = slash == std::string::npos ? path : path.substr(slash + 1);
    }
  }
  auto dir = OpenCheckpointDirectory(storage, dir_path);
  const std::string context = path + "/" + kMetadataFileName;
  Description desc;
  if (comm != nullptr && comm->size() > 1) {
    // Rank 0 reads the metadata once and broadcasts it: one read of the shared filesystem instead of one per rank,
    // and every rank sees the same bytes (or the same error).
    WireWriter w;
    if (comm->rank() == 0) {
      Result<Description> read = [&]() -> Result<Description> {
        if (!dir.ok()) return dir.status();
        return ReadDescription(storage, &dir.value(), path, &dir_path, single_file, /*map=*/false);
      }();
      PutStatus(&w, read.status());
      if (read.ok()) {
        w.U8(read->foreign ? 1 : 0);
        w.Str(std::string_view(read->data, read->size));
      }
    }
    std::string msg = w.Take();
    DCKPT_RETURN_IF_ERROR(comm->Broadcast(&msg, 0, options.timeout).WithContext("opening '" + path + "'"));
    WireReader in(msg);
    Status st;
    uint8_t foreign = 0;
    auto bytes = std::make_shared<std::string>();
    if (!GetStatus(&in, &st)) return Internal("opening '" + path + "': malformed metadata broadcast");
    if (!st.ok()) return st;
    if (!in.U8(&foreign) || !in.Str(bytes.get()))
      return Internal("opening '" + path + "': malformed metadata broadcast");
    if (!dir.ok()) return dir.status();
    // A foreign checkpoint has no metadata file to compare; its data files' sizes are checked against the
    // description when they are opened.
    if (comm->rank() != 0 && !foreign) DCKPT_RETURN_IF_ERROR(CheckSameMetadata(dir->get(), path, *bytes));
    // Where a foreign checkpoint's files are (a hub cache's blobs/) each rank finds through its own directory.
    if (comm->rank() != 0 && foreign) DCKPT_RETURN_IF_ERROR(ResolveInPlace(storage, path, &dir.value(), &dir_path));
    desc.foreign = foreign != 0;
    desc.data = bytes->data();
    desc.size = bytes->size();
    desc.owner = std::move(bytes);
  } else {
    if (!dir.ok()) return dir.status();
    DCKPT_ASSIGN_OR_RETURN(desc,
                           ReadDescription(storage, &dir.value(), path, &dir_path, single_file, options.map_files));
  }
  Result<MetadataView> parsed =
      desc.foreign ? MetadataView::ParseForeign(std::shared_ptr<const std::string>(
                                                    desc.owner, static_cast<const std::string*>(desc.owner.get())),
                                                "checkpoint '" + path + "'")
                   : MetadataView::Parse(std::move(desc.owner), desc.data, desc.size, context);
  DCKPT_RETURN_IF_ERROR(parsed.status());
  MetadataView meta = std::move(parsed).value();
  std::unique_ptr<Reader> reader(new Reader(path, dir_path, std::move(meta), options, std::move(dir).value()));
  if (pinning == FilePinning::kAllAtOpen) {
    reader->dir_->ExpectOpenFiles(reader->meta_.num_files());
    for (uint32_t i = 0; i < reader->meta_.num_files(); ++i) {
      auto opened = reader->OpenDataFile(i);
      if (opened.ok()) {
        reader->files_[i] = std::move(opened).value();
      } else {
        reader->file_errors_[i] = opened.status();
      }
    }
  }
  // The I/O threads start after the files are pinned: in a process with one thread, opening many files grows the
  // descriptor table without waiting for an RCU grace period (posix_storage.cc, ExpectOpenFiles).
  reader->pool_ = std::make_unique<ThreadPool>(options.io_threads ? options.io_threads : DefaultIoThreads());
  return reader;
}

Status Reader::EntryError(size_t entry, const Status& st) const {
  const std::string own = "entry '" + std::string(meta_.entry(entry).name) + "'";
  if (st.message().compare(0, own.size(), own) == 0) {
    // The message names the entry already (the planners' do): the entry once, after the checkpoint.
    return st.WithContext("checkpoint '" + path_ + "'");
  }
  return st.WithContext("checkpoint '" + path_ + "': " + own);
}

Status Reader::EntryError(size_t entry, const std::string& msg) const {
  return EntryError(entry, InvalidArgument(msg));
}

Result<const BaseCheckpoint*> Reader::Base(uint32_t k) {
  std::lock_guard<std::mutex> lock(bases_mu_);
  if (bases_.empty()) bases_.resize(meta_.num_bases());
  if (k >= bases_.size()) return Internal("base index out of range");
  if (!bases_[k]) {
    auto opened = OpenReferencedBase(storage_, path_, meta_, k);
    if (!opened.ok()) return opened.status();
    bases_[k] = std::make_unique<BaseCheckpoint>(std::move(opened).value());
  }
  return bases_[k].get();
}

std::string Reader::FilePath(uint32_t index) const {
  const uint32_t base = meta_.file_base(index);
  const std::string dir = base == 0 ? dir_path_ : SiblingPath(path_, meta_.base_name(base - 1));
  return dir + "/" + std::string(meta_.file_name(index));
}

Result<std::unique_ptr<ReadableFile>> Reader::OpenDataFile(uint32_t index) {
  if (const uint32_t k = meta_.file_base(index); k != 0) {
    DCKPT_ASSIGN_OR_RETURN(const BaseCheckpoint* base, Base(k - 1));
    return OpenReferencedFile(path_, meta_, index, *base);
  }
  const std::string name(meta_.file_name(index));
  return OpenDataFileOfSize(dir_.get(), name, meta_.file_size(index), dir_path_ + "/" + name,
                            "is missing from the checkpoint (it was damaged, or removed or replaced after the "
                            "checkpoint was opened)");
}

Result<const ReadableFile*> Reader::File(uint32_t index) {
  std::lock_guard<std::mutex> lock(files_mu_);
  if (index >= files_.size()) return Internal("file index out of range");
  if (!file_errors_[index].ok()) return file_errors_[index];
  if (!files_[index]) {
    DCKPT_ASSIGN_OR_RETURN(files_[index], OpenDataFile(index));
  }
  return files_[index].get();
}

Result<const char*> Reader::MappedFile(uint32_t index) {
  if (!options_.map_files) {
    return Status(StatusCode::kUnsupported, "checkpoint '" + path_ + "' was opened with map_files off: nothing is " +
                                                "mapped, so nothing can raise SIGBUS");
  }
  DCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, File(index));
  if (file->size() == 0) {
    static const char kEmpty[8] = {};
    return kEmpty;
  }
  const char* map = file->Map();
  if (map == nullptr) {
    return Status(StatusCode::kUnsupported, "data file '" + file->path() + "' cannot be mapped by this storage");
  }
  return map;
}

const ChunkIndex& Reader::Index(size_t entry) {
  std::lock_guard<std::mutex> lock(index_mu_);
  if (!indexes_[entry]) indexes_[entry] = std::make_unique<ChunkIndex>(meta_.entry(entry));
  return *indexes_[entry];
}

ReadBatch::ReadBatch(Reader* reader) : ex_(std::make_unique<ReadExecutor>(reader)) {}
ReadBatch::~ReadBatch() = default;
Status ReadBatch::Add(size_t entry, const std::vector<ReadTarget>& targets) { return ex_->Add(entry, targets); }
Result<std::vector<FileRange>> ReadBatch::VerifiedRanges() { return ex_->VerifiedRanges(); }
void ReadBatch::SetVerifyFilter(VerifyFilter filter) { ex_->SetVerifyFilter(std::move(filter)); }
Status ReadBatch::Run(const ProgressFn& progress) { return ex_->Run(progress); }
Result<std::vector<ChunkRange>> ReadBatch::NeededRanges() { return ex_->NeededRanges(); }
Status ReadBatch::RunRanges(const std::vector<ChunkRange>& ranges, const ProgressFn& progress, const ReadSink& sink) {
  return ex_->RunRanges(ranges, progress, sink);
}
Status ReadBatch::DeliverFromPeer(const ChunkRange& range, const char* data, const ProgressFn& progress) {
  return ex_->DeliverFromPeer(range, data, progress);
}

Status Reader::ReadMany(const std::vector<EntryTargets>& work) {
  ReadBatch batch(this);
  for (const EntryTargets& w : work) DCKPT_RETURN_IF_ERROR(batch.Add(w.entry, w.targets));
  return batch.Run(options_.progress);
}

Status Reader::ReadTargets(size_t entry, const std::vector<ReadTarget>& targets) {
  ReadExecutor ex(this);
  DCKPT_RETURN_IF_ERROR(ex.Add(entry, targets));
  return ex.Run(options_.progress);  // the reader's read options: each region read reports its own bytes
}

Status Reader::ReadRegion(std::string_view name, const Box& box, void* dst, uint64_t dst_size,
                          const MemoryLocation& memory) {
  auto idx = meta_.Find(name);
  if (!idx) return NotFound("checkpoint '" + path_ + "' has no entry '" + std::string(name) + "'");
  EntryView e = meta_.entry(*idx);
  if (e.kind != EntryKind::kTensor) return EntryError(*idx, "is a bytes entry, not a tensor");
  if (box.ndim != e.ndim()) {
    return EntryError(*idx, "region " + box.ToString() + " has " + std::to_string(box.ndim) +
                                " dimensions; the tensor has " + std::to_string(e.ndim()));
  }
  auto need = CheckedVolume(Span<const uint64_t>(box.length, box.ndim), DTypeSize(e.dtype));
  if (!need.ok() || *need != dst_size) {
    return EntryError(*idx, "destination holds " + std::to_string(dst_size) + " bytes; region " + box.ToString() +
                                " of " + DTypeName(e.dtype) + " needs " + (need.ok() ? std::to_string(*need) : "more"));
  }
  return ReadTargets(*idx, {ReadTarget{box, dst, memory}});
}

Result<uint64_t> Reader::ReadBytes(std::string_view name, void* dst, uint64_t capacity) {
  auto idx = meta_.Find(name);
  if (!idx) return NotFound("checkpoint '" + path_ + "' has no entry '" + std::string(name) + "'");
  EntryView e = meta_.entry(*idx);
  if (e.kind != EntryKind::kBytes) return EntryError(*idx, "is a tensor, not a bytes entry");
  const uint64_t size = e.nbytes();
  if (capacity < size) {
    return Status(StatusCode::kBufferTooSmall, "checkpoint '" + path_ + "': bytes entry '" + std::string(name) +
                                                   "' has " + std::to_string(size) + " bytes; the buffer holds " +
                                                   std::to_string(capacity));
  }
  Box box = Box::Whole(e.shape).value();
  DCKPT_RETURN_IF_ERROR(ReadTargets(*idx, {ReadTarget{box, dst, {}}}));
  return size;
}

Status Reader::NoChecksums() const {
  const std::string format = meta_.source() == "torch-dcp" ? "PyTorch DCP" : std::string(meta_.source());
  return Status(StatusCode::kUnsupported,
                "checkpoint '" + path_ + "' is a " + format +
                    " checkpoint: the format carries no checksums, so its bytes cannot be verified (its structure "
                    "was checked when it was opened: every tensor lies inside its file, with the size its shape "
                    "needs)");
}

Status Reader::VerifyAll(const ProgressFn& progress) {
  if (!meta_.checksummed()) return NoChecksums();
  ReadExecutor ex(this);
  for (size_t i = 0; i < meta_.num_entries(); ++i) {
    EntryView e = meta_.entry(i);
    for (size_t c = 0; c < e.num_chunks; ++c) ex.AddVerify(i, static_cast<uint32_t>(c));
  }
  return ex.Run(progress);
}

Box Reader::ChunkBox(size_t entry, uint32_t chunk) const {
  const EntryView e = meta_.entry(entry);
  const uint32_t nd = e.ndim();
  if (e.kind != EntryKind::kTensor) return Box::Whole(e.shape).value();
  // Validated metadata: the chunk's box lies inside the tensor.
  return Box::Make(Span<const uint64_t>(e.chunk_offsets + chunk * nd, nd),
                   Span<const uint64_t>(e.chunk_lengths + chunk * nd, nd))
      .value();
}

Status Reader::MapAll(const std::vector<size_t>& entries, const ProgressFn& progress) {
  if (!options_.map_files) {
    return Status(StatusCode::kUnsupported, "checkpoint '" + path_ + "' was opened with map_files off: nothing is " +
                                                "mapped; read the tensors into buffers instead");
  }
  ReadExecutor ex(this);
  // Compressed chunks are decoded into buffers the reader keeps (those MapChunk decoded already are kept as they are).
  std::vector<std::pair<std::pair<size_t, uint32_t>, std::unique_ptr<char[]>>> decoded;
  auto add = [&](size_t i) -> Status {
    const EntryView e = meta_.entry(i);
    std::vector<ReadTarget> targets;
    for (uint32_t c = 0; c < e.num_chunks; ++c) {
      if (!e.compressed(c)) {
        ex.AddMapped(i, c);
        continue;
      }
      if (Decoded(i, c) != nullptr) continue;
      std::unique_ptr<char[]> buf(new char[e.chunk(c).length]);  // not zeroed: decoded over
      targets.push_back(ReadTarget{ChunkBox(i, c), buf.get(), {}});
      decoded.emplace_back(std::make_pair(i, c), std::move(buf));
    }
    return targets.empty() ? OkStatus() : ex.Add(i, targets);
  };
  if (entries.empty()) {
    for (size_t i = 0; i < meta_.num_entries(); ++i) DCKPT_RETURN_IF_ERROR(add(i));
  }
  for (size_t i : entries) {
    if (i >= meta_.num_entries()) {
      return InvalidArgument("checkpoint '" + path_ + "': no entry #" + std::to_string(i) + " (it has " +
                             std::to_string(meta_.num_entries()) + ")");
    }
    DCKPT_RETURN_IF_ERROR(add(i));
  }
  for (uint32_t f = 0; f < meta_.num_files(); ++f) {
    // Every file is mapped before any is read: a storage that cannot map fails the call before it reads anything.
    auto mapped = MappedFile(f);
    if (!mapped.ok() && mapped.status().code() == StatusCode::kUnsupported) return mapped.status();
  }
  DCKPT_RETURN_IF_ERROR(ex.Run(progress));
  for (auto& [key, buf] : decoded) KeepDecoded(key.first, key.second, std::move(buf));
  return OkStatus();
}

const char* Reader::Decoded(size_t entry, uint32_t chunk) {
  std::lock_guard<std::mutex> lock(decoded_mu_);
  auto it = decoded_.find({entry, chunk});
  return it == decoded_.end() ? nullptr : it->second.get();
}

const char* Reader::KeepDecoded(size_t entry, uint32_t chunk, std::unique_ptr<char[]> bytes) {
  std::lock_guard<std::mutex> lock(decoded_mu_);
  return decoded_.emplace(std::make_pair(entry, chunk), std::move(bytes)).first->second.get();
}

Result<Span<const char>> Reader::MapChunk(size_t entry, uint32_t chunk) {
  if (entry >= meta_.num_entries() || chunk >= meta_.entry(entry).num_chunks) {
    return InvalidArgument("checkpoint '" + path_ + "': no chunk #" + std::to_string(chunk) + " in entry #" +
                           std::to_string(entry));
  }
  const EntryView e = meta_.entry(entry);
  const ChunkLocation loc = e.chunk(chunk);
  if (!e.compressed(chunk)) {
    auto mapped = MappedFile(loc.file);
    if (!mapped.ok()) return EntryError(entry, mapped.status());
    // The metadata was validated: the chunk lies inside the file, whose size was checked.
    return Span<const char>(*mapped + loc.offset, loc.length);
  }
  if (const char* kept = Decoded(entry, chunk)) return Span<const char>(kept, loc.length);
  std::unique_ptr<char[]> buf(new char[loc.length]);
  DCKPT_RETURN_IF_ERROR(ReadTargets(entry, {ReadTarget{ChunkBox(entry, chunk), buf.get(), {}}}));
  return Span<const char>(KeepDecoded(entry, chunk, std::move(buf)), loc.length);
}

Status Reader::VerifyChunk(size_t entry, uint32_t chunk, const ProgressFn& progress) {
  if (entry >= meta_.num_entries() || chunk >= meta_.entry(entry).num_chunks) {
    return InvalidArgument("checkpoint '" + path_ + "': no chunk #" + std::to_string(chunk) + " in entry #" +
                           std::to_string(entry));
  }
  if (!meta_.checksummed()) return NoChecksums();
  ReadExecutor ex(this);
  ex.AddVerify(entry, chunk);
  return ex.Run(progress);
}

IoStats Reader::io_stats() const {
  IoStats s;
  s.bytes_read = stats_.bytes_read.load();
  s.read_calls = stats_.read_calls.load();
  s.bytes_verified = stats_.bytes_verified.load();
  s.bytes_delivered = stats_.bytes_delivered.load();
  s.bytes_mapped = stats_.bytes_mapped.load();
  s.bytes_received_from_peers = stats_.bytes_received_from_peers.load();
  s.bytes_sent_to_peers = stats_.bytes_sent_to_peers.load();
  s.bytes_read_direct = stats_.bytes_read_direct.load();
  return s;
}

}  // namespace distckpt
