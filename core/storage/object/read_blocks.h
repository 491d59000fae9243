// Coalescing of small reads on an object store, where every read is a request: a read much smaller than the block size
// fetches the aligned block around it once, and the reads of the same file that follow (the small tensors of one
// data file, read by several threads) are served from it. Blocks belong to one open file (never shared across opens,
// so an object replaced at the same path is never read stale) and are evicted least recently used, within a budget
// for the whole storage. Concurrent readers of a block being fetched wait for that one fetch.
#ifndef DISTCKPT_CORE_STORAGE_OBJECT_READ_BLOCKS_H_
#define DISTCKPT_CORE_STORAGE_OBJECT_READ_BLOCKS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "core/base/status.h"

namespace distckpt {

class ReadBlocks {
 public:
  /// At most `max_blocks` blocks of `block_size` bytes held at once (blocks being fetched included).
  ReadBlocks(uint64_t block_size, unsigned max_blocks) : block_size_(block_size), max_blocks_(max_blocks) {}
  uint64_t block_size() const { return block_size_; }

  /// Block `index` of file `file` (an id from NewFileId), fetched with `fetch` if it is not held.
  using Block = std::shared_ptr<const std::string>;
  Result<Block> Get(uint64_t file, uint64_t index, const std::function<Result<std::string>()>& fetch);
  /// Drops the blocks of `file` (it was closed).
  void Forget(uint64_t file);
  uint64_t NewFileId();

 private:
  struct Entry {
    uint64_t file, index;
    Block data;  // null while being fetched
  };
  const uint64_t block_size_;
  const unsigned max_blocks_;
  std::mutex mu_;
  std::condition_variable fetched_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t next_file_ = 1;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_OBJECT_READ_BLOCKS_H_
