// Read coalescing on an object store (ObjectStorageOptions::read_block_size): small reads share block fetches, large
// ones go straight through, and nothing stale or failed is ever served from a block.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/testing/status_matchers.h"
#include "core/storage/object/object_storage.h"
#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

// The in-memory object store, counting reads and failing them on demand.
class CountingClient final : public ObjectClient {
 public:
  std::string name() const override { return "counting"; }
  Result<std::unique_ptr<ObjectUpload>> Create(const std::string& p, uint64_t hint) override {
    return inner_->Create(p, hint);
  }
  Result<uint64_t> Size(const std::string& p) override { return inner_->Size(p); }
  Result<size_t> Read(const std::string& p, uint64_t offset, void* data, size_t size) override {
    ++reads;
    if (fail) return IoError("injected");
    return inner_->Read(p, offset, data, size);
  }
  Result<std::vector<std::string>> List(const std::string& d) override { return inner_->List(d); }
  Status Remove(const std::string& p) override { return inner_->Remove(p); }
  Status Commit(const std::string& p, const std::string& data, bool replace) override {
    return inner_->Commit(p, data, replace);
  }
  // With `gated`, ReadArriving reports the first half of what it read, then waits for `release` before the rest.
  Result<size_t> ReadArriving(const std::string& p, uint64_t offset, void* data, size_t size,
                              const std::function<void(size_t)>& arrived) override {
    Result<size_t> got = Read(p, offset, data, size);
    if (!got.ok()) return got;
    if (!gated) {
      arrived(*got);
      return got;
    }
    arrived(*got / 2);
    std::unique_lock<std::mutex> lock(mu);
    released.wait(lock, [&] { return release; });
    arrived(*got);
    return got;
  }
  std::atomic<int> reads{0};
  std::atomic<bool> fail{false};
  std::atomic<bool> gated{false};
  std::mutex mu;
  std::condition_variable released;
  bool release = false;

 private:
  std::shared_ptr<ObjectClient> inner_ = NewMemoryObjectClient();
};

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) >> 2);
  return s;
}

struct Fixture {
  std::shared_ptr<CountingClient> client = std::make_shared<CountingClient>();
  std::unique_ptr<Storage> storage;
  explicit Fixture(uint64_t block) {
    ObjectStorageOptions o;
    o.read_block_size = block;
    o.max_read_blocks = 4;
    storage = NewObjectStorage(client, o);
  }
};

TEST(ReadBlocks, SmallReadsShareOneFetchPerBlock) {
  Fixture f(1024);
  const std::string object = Pattern(4000, 1);
  DCKPT_ASSERT_OK(f.storage->WriteFileDurably("s3://b/data", object));
  DCKPT_ASSERT_OK_AND_ASSIGN(auto file, f.storage->OpenFile("s3://b/data"));
  f.client->reads = 0;
  // 4000 bytes in reads of 10 from 4 threads, straddling block boundaries: 4 blocks, 4 fetches.
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t at = t * 10; at + 10 <= object.size(); at += 40) {
        char buf[10];
        if (!file->ReadAt(at, buf, 10).ok() || std::string(buf, 10) != object.substr(at, 10)) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(f.client->reads, 4);
  // A read across a boundary; a large read goes straight through.
  char two[20];
  DCKPT_ASSERT_OK(file->ReadAt(1014, two, 20));
  EXPECT_EQ(std::string(two, 20), object.substr(1014, 20));
  EXPECT_EQ(f.client->reads, 4);
  std::string big(600, '\0');
  DCKPT_ASSERT_OK(file->ReadAt(100, &big[0], big.size()));
  EXPECT_EQ(big, object.substr(100, 600));
  EXPECT_EQ(f.client->reads, 5);
  // Past the end: the file's error, whatever the blocks hold.
  EXPECT_TRUE(StatusIs(file->ReadAt(3995, two, 10), StatusCode::kCorrupt, {"s3://b/data"}));
}

TEST(ReadBlocks, AFailedFetchIsNotKeptAndAReopenedFileIsNeverStale) {
  Fixture f(1024);
  DCKPT_ASSERT_OK(f.storage->WriteFileDurably("s3://b/meta", Pattern(2000, 1)));
  DCKPT_ASSERT_OK_AND_ASSIGN(auto file, f.storage->OpenFile("s3://b/meta"));
  char buf[8];
  f.client->fail = true;
  EXPECT_TRUE(StatusIs(file->ReadAt(0, buf, 8), StatusCode::kIo, {"s3://b/meta", "injected"}));
  f.client->fail = false;
  DCKPT_ASSERT_OK(file->ReadAt(0, buf, 8));
  EXPECT_EQ(std::string(buf, 8), Pattern(2000, 1).substr(0, 8));
  // Replaced at the same path: a new open reads the new bytes.
  DCKPT_ASSERT_OK(f.storage->WriteFileDurably("s3://b/meta", Pattern(2000, 7)));
  DCKPT_ASSERT_OK_AND_ASSIGN(auto again, f.storage->OpenFile("s3://b/meta"));
  DCKPT_ASSERT_OK(again->ReadAt(0, buf, 8));
  EXPECT_EQ(std::string(buf, 8), Pattern(2000, 7).substr(0, 8));
}

TEST(ReadBlocks, AReadIsServedAsSoonAsItsBytesArrive) {
  Fixture f(4 << 20);
  const std::string object = Pattern(4 << 20, 3);
  DCKPT_ASSERT_OK(f.storage->WriteFileDurably("s3://b/big", object));
  DCKPT_ASSERT_OK_AND_ASSIGN(auto file, f.storage->OpenFile("s3://b/big"));
  f.client->gated = true;
  // The first read fetches the block; its fetch stops halfway until released.
  std::thread fetcher([&] {
    char buf[16];
    EXPECT_TRUE(file->ReadAt(0, buf, sizeof(buf)).ok());
  });
  while (f.client->reads == 0) std::this_thread::yield();
  // A read in the first half completes while the fetch is still waiting.
  char early[16];
  DCKPT_ASSERT_OK(file->ReadAt(1 << 20, early, sizeof(early)));
  EXPECT_EQ(std::string(early, 16), object.substr(1 << 20, 16));
  {
    std::lock_guard<std::mutex> lock(f.client->mu);
    f.client->release = true;
  }
  f.client->released.notify_all();
  char late[16];
  DCKPT_ASSERT_OK(file->ReadAt(3 << 20, late, sizeof(late)));
  EXPECT_EQ(std::string(late, 16), object.substr(3 << 20, 16));
  fetcher.join();
  EXPECT_EQ(f.client->reads, 1);
}

TEST(ReadBlocks, ManyFilesStayWithinTheBudget) {
  Fixture f(1024);
  std::vector<std::unique_ptr<ReadableFile>> files;
  for (int i = 0; i < 10; ++i) {
    const std::string p = "s3://b/f" + std::to_string(i);
    DCKPT_ASSERT_OK(f.storage->WriteFileDurably(p, Pattern(1024, i)));
    DCKPT_ASSERT_OK_AND_ASSIGN(auto file, f.storage->OpenFile(p));
    files.push_back(std::move(file));
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 10; ++i) {
      char buf[4];
      DCKPT_ASSERT_OK(files[i]->ReadAt(8, buf, 4));
      EXPECT_EQ(std::string(buf, 4), Pattern(1024, i).substr(8, 4));
    }
  }
}

// The conformance suite with coalescing on: every storage guarantee still holds.
INSTANTIATE_TEST_SUITE_P(MemoryObjectsWithReadBlocks, StorageConformanceTest,
                         ::testing::Values(StorageConformanceParams{
                             "memory_objects_read_blocks",
                             [] {
                               ObjectStorageOptions o;
                               o.read_block_size = 64;
                               return NewObjectStorage(NewMemoryObjectClient(), o);
                             },
                             [](Storage*) { return std::string("bucket/conformance"); }}),
                         StorageConformanceTestName);

}  // namespace
}  // namespace distckpt
