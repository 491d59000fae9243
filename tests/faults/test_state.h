// The reproducible state the fault-injection and crash-consistency suites save and load: tensors sharded by rows
// over the ranks, a replicated one, a 0-d one, a bytes entry and user metadata, every byte a function of `variant`
// ("model.emb", the frozen weights of a fine-tuning run, of `variant / 1000` only: incremental saves reuse it).
#ifndef DISTCKPT_TESTS_FAULTS_TEST_STATE_H_
#define DISTCKPT_TESTS_FAULTS_TEST_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/engine/reader.h"
#include "core/engine/state.h"

namespace distckpt {
namespace testing_util {

/// A State of about `mib` MiB in all, for rank `rank` of `world`, and the buffers behind it.
class TestState {
 public:
  /// `for_save`: the buffers hold the values; else they are filled with a marker, to be loaded into.
  TestState(bool for_save, int rank, int world, uint64_t variant, uint64_t mib);
  State& state() { return state_; }
  const Status& status() const { return status_; }  ///< building the state
  /// After a load: "" if every value, the bytes entry and the user metadata are the variant's, else what differs.
  std::string Mismatch() const;
  /// Frees the buffers (an async save must no longer need them).
  void DropBuffers();

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape, off, len;
    std::vector<uint8_t> data;
  };
  uint64_t variant_;
  std::vector<Tensor> tensors_;
  std::string blob_;
  std::vector<char> blob_in_;
  State state_;
  Status status_;
};

/// Whether the checkpoint at `path` holds exactly the values of `variant` (as saved by any number of ranks):
/// "" if so, else why not (an error, or the differences).
std::string CheckCheckpoint(const std::string& path, uint64_t variant, uint64_t mib);
/// The same through an open reader: everything checked comes from the one checkpoint it pinned when it opened.
std::string CheckCheckpoint(Reader* reader, uint64_t variant, uint64_t mib);

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_TESTS_FAULTS_TEST_STATE_H_
