#include "core/manager/restore_source.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/format/metadata.h"
#include "core/plan/save_planner.h"

namespace distckpt {
namespace manager_internal {

namespace {

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

Status OutOfRange(const std::string& path, uint64_t offset, size_t size, uint64_t file_size) {
  return Corrupt("file '" + path + "' is truncated: " + std::to_string(size) + " bytes at " + std::to_string(offset) +
                 " asked of " + std::to_string(file_size));
}

// Bytes held in memory, read as a file (the merged metadata, or what peers sent).
class MemoryReadable final : public ReadableFile {
 public:
  MemoryReadable(std::string path, const char* data, uint64_t size, std::shared_ptr<const void> owner,
                 const FetchedFile* fetched)
      : path_(std::move(path)), data_(data), size_(size), owner_(std::move(owner)), fetched_(fetched) {}
  Status ReadAt(uint64_t offset, void* out, size_t size) const override {
    if (offset > size_ || size > size_ - offset) return OutOfRange(path_, offset, size, size_);
    if (size) std::memcpy(out, data_ + offset, size);
    return OkStatus();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }
  const char* Map() const override { return data_; }
  bool Resident(uint64_t offset, uint64_t size) const override {
    return fetched_ == nullptr || fetched_->Received(offset, offset + size);
  }
  Status Populate(uint64_t, uint64_t) const override { return OkStatus(); }

 private:
  std::string path_;
  const char* data_;
  uint64_t size_;
  std::shared_ptr<const void> owner_;
  const FetchedFile* fetched_;
};

class SourceDirectory final : public Directory {
 public:
  SourceDirectory(std::string path, std::shared_ptr<const std::string> metadata,
                  std::shared_ptr<const std::vector<RestoreSource::File>> files)
      : path_(std::move(path)), metadata_(std::move(metadata)), files_(std::move(files)) {}
  const std::string& path() const override { return path_; }

  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& name) override {
    if (name == kMetadataFileName) {
      return std::unique_ptr<ReadableFile>(std::make_unique<MemoryReadable>(path_ + "/" + name, metadata_->data(),
                                                                            metadata_->size(), metadata_, nullptr));
    }
    const RestoreSource::File* f = Find(name);
    if (f == nullptr) return NotFound("'" + path_ + "/" + name + "' is not a file of the restored step");
    if (f->fetched) {
      const FetchedFile* fetched = f->fetched.get();
      return std::unique_ptr<ReadableFile>(std::make_unique<MemoryReadable>(
          fetched->path() + " (as received from a peer)", fetched->data(), fetched->size(), f->fetched, fetched));
    }
    return f->part_dir->OpenFile(f->name);
  }

  Result<bool> Exists(const std::string& name) override { return name == kMetadataFileName || Find(name) != nullptr; }

 private:
  const RestoreSource::File* Find(const std::string& name) const {
    for (uint32_t k = 0; k < files_->size(); ++k) {
      if (DataFileName(k) == name) return &(*files_)[k];
    }
    return nullptr;
  }
  std::string path_;
  std::shared_ptr<const std::string> metadata_;
  std::shared_ptr<const std::vector<RestoreSource::File>> files_;
};

}  // namespace

Result<std::unique_ptr<FetchedFile>> FetchedFile::Create(std::string path, uint64_t size) {
  const uint64_t page = PageSize();
  const uint64_t mapped = std::max<uint64_t>(page, (size + page - 1) / page * page);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return ErrnoError(errno, "reserving " + std::to_string(size) + " bytes for '" + path + "'");
  return std::unique_ptr<FetchedFile>(new FetchedFile(std::move(path), static_cast<char*>(p), size, mapped));
}

FetchedFile::FetchedFile(std::string path, char* base, uint64_t size, uint64_t mapped)
    : path_(std::move(path)), base_(base), size_(size), mapped_(mapped) {}

FetchedFile::~FetchedFile() { ::munmap(base_, mapped_); }

void FetchedFile::MarkReceived(uint64_t lo, uint64_t hi) {
  if (hi <= lo) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::lower_bound(received_.begin(), received_.end(), std::make_pair(lo, lo));
  it = received_.insert(it, {lo, hi});
  // Merge with the neighbours it touches.
  if (it != received_.begin() && std::prev(it)->second >= it->first) {
    --it;
    it->second = std::max(it->second, std::next(it)->second);
    received_.erase(std::next(it));
  }
  while (std::next(it) != received_.end() && std::next(it)->first <= it->second) {
    it->second = std::max(it->second, std::next(it)->second);
    received_.erase(std::next(it));
  }
}

bool FetchedFile::Received(uint64_t lo, uint64_t hi) const {
  if (hi <= lo) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::upper_bound(received_.begin(), received_.end(), std::make_pair(lo, UINT64_MAX));
  if (it == received_.begin()) return false;
  --it;
  return it->first <= lo && hi <= it->second;
}

void FetchedFile::Release(uint64_t lo, uint64_t hi) {
  const uint64_t page = PageSize();
  const uint64_t a = (lo + page - 1) / page * page, b = std::min(hi, size_) / page * page;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<uint64_t, uint64_t>> kept;
    for (const auto& [s, e] : received_) {
      if (e <= lo || s >= hi) {
        kept.emplace_back(s, e);
        continue;
      }
      if (s < lo) kept.emplace_back(s, lo);
      if (e > hi) kept.emplace_back(hi, e);
    }
    received_.swap(kept);
  }
  if (b > a) (void)::madvise(base_ + a, b - a, MADV_DONTNEED);
}

RestoreSource::RestoreSource(std::string path, std::string metadata, std::vector<File> files)
    : path_(std::move(path)),
      metadata_(std::make_shared<const std::string>(std::move(metadata))),
      files_(std::make_shared<const std::vector<File>>(std::move(files))) {}

Result<std::unique_ptr<Directory>> RestoreSource::OpenDirectory(const std::string& path) {
  if (path != path_) return NotFound("'" + path + "' is not the step being restored ('" + path_ + "')");
  return std::unique_ptr<Directory>(std::make_unique<SourceDirectory>(path_, metadata_, files_));
}

Status RestoreSource::Refuse(const std::string& path) const {
  return Status(StatusCode::kUnsupported,
                "'" + path + "': a restore's source is read only, through the directory of '" + path_ + "'");
}

}  // namespace manager_internal
}  // namespace distckpt
