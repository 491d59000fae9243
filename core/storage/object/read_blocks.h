// Coalescing of small reads on an object store, where every read is a request: a read much smaller than the block size
// fetches the aligned block around it once, and the reads of the same file that follow (the small tensors of one
// data file, read by several threads) are served from it. A read is served as soon as its bytes have arrived, while
// the rest of the block is still coming, so one large GET overlaps with the work on what it already brought.
// Blocks belong to one open file (never shared across opens, so an object replaced at the same path is never read
// stale) and are evicted least recently used, within a budget for the whole storage. Concurrent readers of a block
// being fetched wait for that one fetch.
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

  /// Fills `dst` with `size` bytes of the block's bytes: fetch(dst, size, arrived) writes them from the start, calling
  /// arrived(n) as the first n are in (n grows), and fails or returns once all are.
  using Fetch = std::function<Status(char* dst, size_t size, const std::function<void(size_t)>& arrived)>;
  /// Copies bytes [lo, lo + n) of block `index` of file `file` (an id from NewFileId; the block is `block_bytes`
  /// long) into `out`, fetching the block with `fetch` if it is not held or being fetched.
  Status Read(uint64_t file, uint64_t index, size_t block_bytes, size_t lo, size_t n, char* out, const Fetch& fetch);
  /// Drops the blocks of `file` (it was closed).
  void Forget(uint64_t file);
  uint64_t NewFileId();

 private:
  // Block memory: anonymous pages, transparent huge pages asked for where the block is large (a 256 MiB block filled
  // from the network otherwise takes 65536 page faults).
  struct PagesDeleter {
    size_t size;
    void operator()(char* p) const;
  };
  struct Block {
    std::unique_ptr<char[], PagesDeleter> bytes{nullptr, PagesDeleter{0}};
    size_t size = 0;
    size_t arrived = 0;  // bytes [0, arrived) are in (guarded by mu_)
    bool done = false;
    Status error;  // done and failed
  };
  struct Entry {
    uint64_t file, index;
    std::shared_ptr<Block> block;
  };
  // Evicts fetched blocks, least recently used first, until there is room for one more; false if every slot is a
  // block still being fetched.
  bool MakeRoom();

  const uint64_t block_size_;
  const unsigned max_blocks_;
  std::mutex mu_;
  std::condition_variable progress_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t next_file_ = 1;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_OBJECT_READ_BLOCKS_H_
