#include "core/storage/object/read_blocks.h"

namespace distckpt {

uint64_t ReadBlocks::NewFileId() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_file_++;
}

void ReadBlocks::Forget(uint64_t file) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.remove_if([&](const Entry& e) { return e.file == file && e.data != nullptr; });
}

Result<ReadBlocks::Block> ReadBlocks::Get(uint64_t file, uint64_t index,
                                          const std::function<Result<std::string>()>& fetch) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = entries_.begin();
    for (; it != entries_.end(); ++it) {
      if (it->file == file && it->index == index) break;
    }
    if (it == entries_.end()) break;  // not held: fetch it below
    if (it->data != nullptr) {
      entries_.splice(entries_.begin(), entries_, it);
      return it->data;
    }
    fetched_.wait(lock);  // another reader is fetching it: wait, then look again (it may have failed)
  }
  // Room for one more: evict the least recently used fetched block; with every slot fetching, fetch without holding.
  size_t held = entries_.size();
  for (auto it = entries_.end(); held >= max_blocks_ && it != entries_.begin();) {
    --it;
    if (it->data != nullptr) {
      it = entries_.erase(it);
      --held;
    }
  }
  const bool hold = held < max_blocks_;
  if (hold) entries_.push_front(Entry{file, index, nullptr});
  lock.unlock();
  Result<std::string> got = fetch();
  lock.lock();
  Block block = got.ok() ? std::make_shared<const std::string>(std::move(got).value()) : nullptr;
  if (hold) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->file == file && it->index == index && it->data == nullptr) {
        if (block != nullptr) it->data = block;
        else entries_.erase(it);
        break;
      }
    }
    fetched_.notify_all();
  }
  if (block == nullptr) return got.status();
  return block;
}

}  // namespace distckpt
