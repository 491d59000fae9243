// The DCP fixtures under tests/fixtures/dcp (written by the real torch.distributed.checkpoint, see make_fixtures.py
// there) as the tests of core/foreign read them: paths, the expected.tsv rows, and the zip64 fixture, which is kept
// as the first and last 64 KiB of its 4 GiB data file and served as a sparse file.
#ifndef DISTCKPT_CORE_FOREIGN_TESTING_DCP_FIXTURES_H_
#define DISTCKPT_CORE_FOREIGN_TESTING_DCP_FIXTURES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/storage/storage.h"

namespace distckpt {
namespace testing_util {

/// tests/fixtures/dcp/<name>, relative to the working directory (a Bazel test's runfiles root, or the repo root).
std::string DcpFixtureDir(const std::string& name);

/// A copy of the fixture checkpoint <name> in a fresh scratch directory (Bazel's runfiles are symbolic links, which
/// a reader never follows inside a checkpoint); returns its path.
std::string RealCopyOfDcpFixture(const std::string& name);

/// The rows of expected.tsv, split at tabs, comments left out.
std::vector<std::vector<std::string>> DcpExpectedRows();

/// A read-only file of `size` bytes that holds `head` at its start, `tail` at its end and zeros between.
class SparseFile : public ReadableFile {
 public:
  SparseFile(std::string path, std::string head, std::string tail, uint64_t size)
      : path_(std::move(path)), head_(std::move(head)), tail_(std::move(tail)), size_(size) {}
  Status ReadAt(uint64_t offset, void* data, size_t size) const override;
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }
  /// Bytes read so far (every ReadAt).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_, head_, tail_;
  uint64_t size_;
  mutable uint64_t bytes_read_ = 0;
};

/// The zip64 fixture's data file as a SparseFile (its size from expected.tsv).
std::unique_ptr<SparseFile> OpenZip64Fixture();

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_TESTING_DCP_FIXTURES_H_
