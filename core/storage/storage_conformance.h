// The conformance suite every storage backend passes: file I/O semantics, error codes and wording, and the staged
// commit protocol. A backend's test instantiates it:
//
//   INSTANTIATE_TEST_SUITE_P(Posix, StorageConformanceTest,
//                            ::testing::Values(StorageConformanceParams{"posix", MakeStorage, MakeRoot}),
//                            StorageConformanceTestName);
//
// Paths are built with "/" and must mean the same thing in every backend. The status assertions (StatusIs,
// DCKPT_*_OK) come with it, from core/base/testing/status_matchers.h.
#ifndef DISTCKPT_CORE_STORAGE_STORAGE_CONFORMANCE_H_
#define DISTCKPT_CORE_STORAGE_STORAGE_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/base/testing/status_matchers.h"
#include "core/storage/storage.h"

namespace distckpt {

/// How the suite gets a backend and a place to work in it.
struct StorageConformanceParams {
  std::string name;  ///< test-name suffix, e.g. "posix"
  /// A fresh backend; called once per test.
  std::function<std::shared_ptr<Storage>()> make_storage;
  /// Returns an existing, empty directory in `storage` that only this test uses.
  std::function<std::string(Storage* storage)> make_root;
};

/// Lets GoogleTest print a parameter by name rather than as raw bytes.
inline void PrintTo(const StorageConformanceParams& params, std::ostream* os) { *os << params.name; }

/// The fixture: storage() is fresh and root() empty for every test.
class StorageConformanceTest : public ::testing::TestWithParam<StorageConformanceParams> {
 protected:
  void SetUp() override;
  Storage* storage() { return storage_.get(); }
  const std::string& root() const { return root_; }
  /// True for backends with directories and rename (CommitProtocol::kRename); the tests of directories, rename and
  /// the rename commit run only there. Every backend runs the rest, the metadata-last commit included.
  bool Filesystem() { return storage_->commit_protocol() == CommitProtocol::kRename; }
  /// root() + "/" + name.
  std::string Path(const std::string& name) const { return root_ + "/" + name; }

 private:
  std::shared_ptr<Storage> storage_;
  std::string root_;
};

/// Names instantiations after StorageConformanceParams::name.
std::string StorageConformanceTestName(const ::testing::TestParamInfo<StorageConformanceParams>& info);

/// Every file below `dir` (relative name -> bytes) and every directory (relative name + "/" -> ""), for comparing
/// whole trees byte for byte.
std::map<std::string, std::string> SnapshotTree(Storage* storage, const std::string& dir);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_STORAGE_CONFORMANCE_H_
