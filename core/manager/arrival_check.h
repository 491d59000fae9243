// Checks a part's files as they arrive from another rank (replication): the part's metadata comes first, then its
// data files front to back, and every checksum block is hashed the moment its last byte is in, from the bytes just
// received, so that a replica is verified without reading it again. Internal to core/manager.
#ifndef DISTCKPT_CORE_MANAGER_ARRIVAL_CHECK_H_
#define DISTCKPT_CORE_MANAGER_ARRIVAL_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace distckpt {
namespace manager_internal {

class ArrivalCheck {
 public:
  /// `what` names the replica in errors ("the replica of rank 3's part in '<dir>'"); `files` are the part's file
  /// names in the order they arrive, the metadata file (kMetadataFileName) first.
  ArrivalCheck(std::string what, std::vector<std::string> files, std::vector<uint64_t> sizes);
  /// The next `n` bytes of file `i` at `offset` (each file's bytes arrive in order, without gaps). The first error
  /// sticks.
  void Feed(size_t i, uint64_t offset, const char* data, uint64_t n);
  /// OK once every file has arrived whole and every block matched.
  Status Finish() const;

 private:
  struct Block {
    uint64_t lo, hi, hash;
    std::string entry;
    bool chunk;  ///< the chunk's single checksum (no block table)
  };
  void Parse();
  void FeedData(size_t i, uint64_t offset, const char* data, uint64_t n);

  std::string what_;
  std::vector<std::string> files_;
  std::vector<uint64_t> sizes_, arrived_;
  std::string metadata_;
  bool parsed_ = false;
  std::vector<std::vector<Block>> blocks_;  // per file, sorted
  std::vector<size_t> next_;                // per file: the first block not yet checked
  std::string carry_;                       // the first bytes of a block that straddles two arrivals
  Status st_;
};

}  // namespace manager_internal
}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_ARRIVAL_CHECK_H_
