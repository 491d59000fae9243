// Files assembled into parts by ObjectStorage for a client with multipart uploads: a fake client records every part
// (number, bytes, the order they started in) and publishes the object on Complete; the storage's part buffers are
// counted (ObjectStorageOptions::part_memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/storage/object/object_storage.h"
#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

class PartsClient;

class FakePartUpload final : public ObjectPartUpload {
 public:
  FakePartUpload(PartsClient* client, std::string path) : client_(client), path_(std::move(path)) {}
  Status UploadPart(unsigned number, const void* data, size_t size) override;
  Status Complete() override;
  Status Abort() override;

 private:
  PartsClient* client_;
  const std::string path_;
  std::mutex mu_;
  std::map<unsigned, std::string> parts_;
};

// An object store taking multipart uploads; everything but the parts is the in-memory object store.
class PartsClient final : public ObjectClient {
 public:
  explicit PartsClient(uint64_t min_part) : objects_(NewMemoryObjectClient()), min_part_(min_part) {}
  std::string name() const override { return "parts"; }
  Result<std::unique_ptr<ObjectUpload>> Create(const std::string& path, uint64_t size_hint) override {
    ++creates;
    return objects_->Create(path, size_hint);
  }
  Result<uint64_t> Size(const std::string& path) override { return objects_->Size(path); }
  Result<size_t> Read(const std::string& path, uint64_t offset, void* data, size_t size) override {
    return objects_->Read(path, offset, data, size);
  }
  Result<std::vector<std::string>> List(const std::string& dir) override { return objects_->List(dir); }
  Status Remove(const std::string& path) override { return objects_->Remove(path); }
  Status Commit(const std::string& path, const std::string& data, bool replace) override {
    return objects_->Commit(path, data, replace);
  }
  bool has_parts() const override { return true; }
  uint64_t min_part_size() const override { return min_part_; }
  Result<std::unique_ptr<ObjectPartUpload>> BeginParts(const std::string& path, uint64_t) override {
    ++begun;
    ++open_uploads;
    return std::unique_ptr<ObjectPartUpload>(new FakePartUpload(this, path));
  }

  std::shared_ptr<ObjectClient> objects_;
  const uint64_t min_part_;
  std::atomic<int> creates{0}, begun{0}, completed{0}, aborted{0}, open_uploads{0};
  std::atomic<int> fail_part{0};  // > 0: that part number fails with kIo
  std::mutex mu;
  std::vector<std::pair<unsigned, size_t>> started;  // (part number, size) in the order UploadPart was entered
};

Status FakePartUpload::UploadPart(unsigned number, const void* data, size_t size) {
  {
    std::lock_guard<std::mutex> lock(client_->mu);
    client_->started.emplace_back(number, size);
  }
  if (number == 0) return Internal("part numbers start at 1");
  if (client_->fail_part.load() == static_cast<int>(number)) return IoError("connection reset");
  std::this_thread::sleep_for(std::chrono::microseconds(200));  // a store's latency: parts overlap
  std::lock_guard<std::mutex> lock(mu_);
  if (!parts_.emplace(number, std::string(static_cast<const char*>(data), size)).second) {
    return Internal("part " + std::to_string(number) + " sent twice");
  }
  return OkStatus();
}

Status FakePartUpload::Complete() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string object;
  unsigned expect = 1;
  for (const auto& [number, bytes] : parts_) {
    if (number != expect++) return Internal("part " + std::to_string(expect - 1) + " is missing");
    if (number != parts_.rbegin()->first && bytes.size() < client_->min_part_) return Internal("a part too small");
    object += bytes;
  }
  ++client_->completed;
  --client_->open_uploads;
  return client_->objects_->Commit(path_, object, /*replace=*/true);
}

Status FakePartUpload::Abort() {
  ++client_->aborted;
  --client_->open_uploads;
  return OkStatus();
}

constexpr uint64_t kPart = 64 << 10;

struct Fixture {
  std::shared_ptr<PartsClient> client;
  std::shared_ptr<PartMemory> memory = std::make_shared<PartMemory>();
  std::unique_ptr<Storage> storage;
  explicit Fixture(unsigned max_buffers = 4, unsigned max_in_flight = 16) {
    client = std::make_shared<PartsClient>(kPart);
    ObjectStorageOptions o;
    o.max_in_flight = max_in_flight;
    o.max_part_buffers = max_buffers;
    o.part_memory = memory;
    storage = NewObjectStorage(client, o);
  }
};

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// The sizes of the parts (by number) checked against the file: numbered 1..n, each of kPart bytes but the last.
void ExpectParts(PartsClient* client, size_t file_size) {
  std::lock_guard<std::mutex> lock(client->mu);
  const size_t n = (file_size + kPart - 1) / kPart;
  ASSERT_EQ(client->started.size(), n);
  std::vector<unsigned> numbers;
  for (const auto& [number, size] : client->started) {
    numbers.push_back(number);
    EXPECT_EQ(size, number < n ? kPart : file_size - (n - 1) * kPart) << "part " << number;
  }
  std::sort(numbers.begin(), numbers.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(numbers[i], i + 1);
}

TEST(ObjectPartsTest, ConcurrentOutOfOrderWritersGiveTheFileInParts) {
  Fixture f;
  const size_t size = 40 * kPart + 12345;
  const std::string data = Bytes(size, 1);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/data"));
  DCKPT_ASSERT_OK(file->Preallocate(size));
  // 16 KiB pieces taken in order by 8 threads, each pair swapped: every thread's writes land out of order, and
  // neighbouring pieces finish in any order.
  const size_t piece = 16 << 10, pieces = (size + piece - 1) / piece;
  std::vector<size_t> order(pieces);
  for (size_t i = 0; i < pieces; ++i) order[i] = (i ^ 1) < pieces ? i ^ 1 : i;
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < pieces;) {
        const size_t off = order[i] * piece, n = std::min(piece, size - off);
        if (!file->WriteAt(off, data.data() + off, n).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  {
    std::lock_guard<std::mutex> lock(f.client->mu);
    EXPECT_GE(f.client->started.size(), 30u) << "parts go up while the file is written, not at close";
  }
  DCKPT_ASSERT_OK(file->Close());
  ExpectParts(f.client.get(), size);
  EXPECT_EQ(f.client->completed.load(), 1);
  EXPECT_EQ(f.client->creates.load(), 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string back, f.storage->ReadFile("b/data", size));
  EXPECT_TRUE(back == data);
  EXPECT_EQ(f.memory->now.load(), 0u);
}

TEST(ObjectPartsTest, AFileLargerThanTheBuffersIsStreamed) {
  // 64 MiB through at most 3 part buffers of 64 KiB: one writer, its writes in order but for pairs swapped across
  // part boundaries (the reorder window takes them).
  Fixture f(/*max_buffers=*/3);
  const size_t size = 1024 * kPart;
  const std::string data = Bytes(size, 2);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/big"));
  DCKPT_ASSERT_OK(file->Preallocate(size));
  const size_t piece = 48 << 10, pieces = (size + piece - 1) / piece;
  for (size_t j = 0; j < pieces; ++j) {
    const size_t i = (j ^ 1) < pieces ? j ^ 1 : j;
    const size_t off = i * piece, n = std::min(piece, size - off);
    DCKPT_ASSERT_OK(file->WriteAt(off, data.data() + off, n));
    ASSERT_LE(f.memory->now.load(), 3 * kPart);
  }
  DCKPT_ASSERT_OK(file->Close());
  EXPECT_LE(f.memory->peak.load(), 3 * kPart) << "a streamed file holds at most max_part_buffers parts";
  EXPECT_GT(f.memory->peak.load(), 0u);
  ExpectParts(f.client.get(), size);
  {
    // One writer: the parts started in order.
    std::lock_guard<std::mutex> lock(f.client->mu);
    for (size_t i = 0; i < f.client->started.size(); ++i) ASSERT_EQ(f.client->started[i].first, i + 1);
  }
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string back, f.storage->ReadFile("b/big", size));
  EXPECT_TRUE(back == data);
}

TEST(ObjectPartsTest, OneWriteOfManyPartsIsStreamedToo) {
  Fixture f(/*max_buffers=*/2);
  const size_t size = 64 * kPart + 5;
  const std::string data = Bytes(size, 7);
  DCKPT_ASSERT_OK(f.storage->WriteFileDurably("b/one-write", data));
  EXPECT_LE(f.memory->peak.load(), 2 * kPart);
  ExpectParts(f.client.get(), size);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string back, f.storage->ReadFile("b/one-write", size));
  EXPECT_TRUE(back == data);
}

TEST(ObjectPartsTest, ExpectedRangesLetPartsWithPaddingGoUpEarly) {
  // Chunks with gaps between them (the 4 KiB alignment of a data file): without the hint the parts would wait for
  // bytes that never come.
  Fixture f(/*max_buffers=*/2);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t off = 0; off < 64 * kPart; off += 20000) ranges.emplace_back(off, 15000);
  const uint64_t size = ranges.back().first + ranges.back().second;
  const std::string data = Bytes(size, 3);
  std::string want(size, '\0');
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/padded"));
  DCKPT_ASSERT_OK(file->Preallocate(size));
  file->ExpectWrites(ranges);
  for (const auto& [off, n] : ranges) {
    DCKPT_ASSERT_OK(file->WriteAt(off, data.data() + off, n));
    std::memcpy(&want[off], data.data() + off, n);
  }
  EXPECT_LE(f.memory->peak.load(), 2 * kPart);
  DCKPT_ASSERT_OK(file->Truncate(size));
  DCKPT_ASSERT_OK(file->Close());
  ExpectParts(f.client.get(), size);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string back, f.storage->ReadFile("b/padded", size));
  EXPECT_TRUE(back == want);
}

TEST(ObjectPartsTest, WritesInAnyOrderStillMakeTheRightFile) {
  // Backwards, one writer: nothing can fill the window's first part, so the file takes more buffers rather than
  // wait forever; the object is still right.
  Fixture f(/*max_buffers=*/2);
  const size_t size = 10 * kPart + 7;
  const std::string data = Bytes(size, 4);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/backwards"));
  const size_t piece = 10000;
  for (size_t off = (size - 1) / piece * piece;; off -= piece) {
    DCKPT_ASSERT_OK(file->WriteAt(off, data.data() + off, std::min(piece, size - off)));
    if (off == 0) break;
  }
  DCKPT_ASSERT_OK(file->Close());
  ExpectParts(f.client.get(), size);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string back, f.storage->ReadFile("b/backwards", size));
  EXPECT_TRUE(back == data);
}

TEST(ObjectPartsTest, AFailedPartAbortsTheUploadAndNothingIsVisible) {
  Fixture f;
  f.client->fail_part = 3;
  const size_t size = 8 * kPart;
  const std::string data = Bytes(size, 5);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/failed"));
  Status st;
  for (size_t off = 0; off < size && st.ok(); off += kPart / 2) st = file->WriteAt(off, data.data() + off, kPart / 2);
  EXPECT_TRUE(StatusIs(st, StatusCode::kIo, {"part 3", "b/failed", "connection reset"})) << st.ToString();
  // Later calls report the failure; close aborts.
  EXPECT_FALSE(file->WriteAt(size, "x", 1).ok());
  EXPECT_TRUE(StatusIs(file->Close(), StatusCode::kIo, {"connection reset"}));
  EXPECT_EQ(f.client->aborted.load(), 1);
  EXPECT_EQ(f.client->completed.load(), 0);
  EXPECT_EQ(f.client->open_uploads.load(), 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, f.storage->Exists("b/failed"));
  EXPECT_FALSE(exists);
  EXPECT_EQ(f.memory->now.load(), 0u);
}

TEST(ObjectPartsTest, ADiscardedFileAbortsItsUpload) {
  Fixture f;
  {
    DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/dropped"));
    const std::string data = Bytes(2 * kPart + 100, 6);
    DCKPT_ASSERT_OK(file->WriteAt(0, data.data(), data.size()));
    std::lock_guard<std::mutex> lock(f.client->mu);
    EXPECT_EQ(f.client->started.size(), 2u);  // the third part waits for the file's end
  }
  EXPECT_EQ(f.client->aborted.load(), 1);
  EXPECT_EQ(f.client->open_uploads.load(), 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, f.storage->Exists("b/dropped"));
  EXPECT_FALSE(exists);
}

TEST(ObjectPartsTest, AFileOfOnePartIsWrittenWhole) {
  Fixture f;
  DCKPT_ASSERT_OK(f.storage->WriteFileDurably("b/small", "metadata"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, f.storage->CreateFile("b/empty"));
  DCKPT_ASSERT_OK(file->Close());
  EXPECT_EQ(f.client->begun.load(), 0);
  EXPECT_EQ(f.client->creates.load(), 2);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string back, f.storage->ReadFile("b/small", 100));
  EXPECT_EQ(back, "metadata");
  DCKPT_ASSERT_OK_AND_ASSIGN(uint64_t empty, f.storage->FileSize("b/empty"));
  EXPECT_EQ(empty, 0u);
}

std::unique_ptr<Storage> MakePartsStorage() {
  ObjectStorageOptions o;
  o.part_size = 4096;  // small: the conformance suite's files span several parts
  return NewObjectStorage(std::make_shared<PartsClient>(4096), o);
}

INSTANTIATE_TEST_SUITE_P(Parts, StorageConformanceTest,
                         ::testing::Values(StorageConformanceParams{
                             "parts", MakePartsStorage, [](Storage*) { return std::string("bucket/conformance"); }}),
                         StorageConformanceTestName);

}  // namespace
}  // namespace distckpt
