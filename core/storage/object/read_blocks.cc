#include "core/storage/object/read_blocks.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace distckpt {
namespace {

// Waiting readers are woken when at least this much more has arrived (and at the end), not on every network buffer.
constexpr size_t kWakeBytes = size_t{1} << 20;

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

void ReadBlocks::PagesDeleter::operator()(char* p) const {
  if (p != nullptr) ::munmap(p, size);
}

uint64_t ReadBlocks::NewFileId() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_file_++;
}

void ReadBlocks::Forget(uint64_t file) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.remove_if([&](const Entry& e) { return e.file == file && e.block->done; });
}

bool ReadBlocks::MakeRoom() {
  size_t held = entries_.size();
  for (auto it = entries_.end(); held >= max_blocks_ && it != entries_.begin();) {
    --it;
    if (it->block->done) {
      it = entries_.erase(it);
      --held;
    }
  }
  return held < max_blocks_;
}

Status ReadBlocks::Read(uint64_t file, uint64_t index, size_t block_bytes, size_t lo, size_t n, char* out,
                        const Fetch& fetch) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Block> block;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->file == file && it->index == index && !(it->block->done && !it->block->error.ok())) {
      block = it->block;
      entries_.splice(entries_.begin(), entries_, it);
      break;
    }
  }
  if (block != nullptr) {
    // Held or being fetched: wait for the bytes wanted (or the fetch's failure).
    progress_.wait(lock, [&] { return block->arrived >= lo + n || block->done; });
    if (block->arrived < lo + n) {
      return block->error.ok() ? Internal("a read block ended before the bytes read") : block->error;
    }
    if (block->size < lo + n) return Internal("a read block is shorter than a read inside it");
    lock.unlock();
    std::memcpy(out, block->bytes.get() + lo, n);  // arrived bytes never change
    return OkStatus();
  }
  // Fetch it here. Held for others only where the budget has room (else fetched for this read alone).
  block = std::make_shared<Block>();
  // Not zeroed by us: every byte is written by the fetch before it is read.
  void* pages =
      ::mmap(nullptr, std::max<size_t>(block_bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED) {
    return Status(StatusCode::kNoMemory, "no memory for a read block of " + std::to_string(block_bytes) + " bytes");
  }
  if (block_bytes >= kHugePage) (void)::madvise(pages, block_bytes, MADV_HUGEPAGE);
  block->bytes =
      std::unique_ptr<char[], PagesDeleter>(static_cast<char*>(pages), PagesDeleter{std::max<size_t>(block_bytes, 1)});
  block->size = block_bytes;
  const bool shared = MakeRoom();
  if (shared) entries_.push_front(Entry{file, index, block});
  lock.unlock();
  size_t woken = 0;
  Status st = fetch(block->bytes.get(), block_bytes, [&](size_t arrived) {
    if (!shared || arrived < woken + kWakeBytes) return;
    {
      std::lock_guard<std::mutex> guard(mu_);
      block->arrived = arrived;
    }
    woken = arrived;
    progress_.notify_all();
  });
  lock.lock();
  block->done = true;
  if (st.ok()) {
    block->arrived = block_bytes;
  } else {
    block->error = st;
    entries_.remove_if([&](const Entry& e) { return e.block == block; });
  }
  lock.unlock();
  progress_.notify_all();
  if (!st.ok()) return st;
  std::memcpy(out, block->bytes.get() + lo, n);
  return OkStatus();
}

}  // namespace distckpt
