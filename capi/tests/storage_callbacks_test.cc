// Storage the host plugs in through dckpt_storage_callbacks: an object store written here against the C callbacks
// only (a map behind a mutex, objects appearing when closed, a conditional commit). It passes the storage conformance
// suite, and checkpoints saved through it load, verify, reshard and prune through the C ABI like any other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/include/distckpt/distckpt.h"
#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

// ---- The host's object store, through the C callbacks only -----------------------------------------------------

struct HostStore {
  std::mutex mu;
  std::map<std::string, std::string> objects;
  std::atomic<int> in_flight{0}, max_seen{0};
  std::atomic<int> fail_writes_after{-1};  // >= 0: that many writes succeed, then DCKPT_ENOSPC
  std::atomic<int> creates{0}, commits{0};
};

struct HostFile {
  std::string path;
  std::mutex mu;
  std::string data;
};

struct InFlight {
  explicit InFlight(HostStore* s) : s_(s) {
    const int now = ++s_->in_flight;
    int seen = s_->max_seen.load();
    while (now > seen && !s_->max_seen.compare_exchange_weak(seen, now)) {
    }
  }
  ~InFlight() { --s_->in_flight; }
  HostStore* s_;
};

HostStore* StoreOf(void* user_data) { return static_cast<HostStore*>(user_data); }

int Create(dckpt_storage_file** file, const char* path, uint64_t size_hint, void* user_data) {
  ++StoreOf(user_data)->creates;
  auto* f = new HostFile{path, {}, {}};
  f->data.reserve(std::min<uint64_t>(size_hint, 1 << 28));
  *file = f;
  return 0;
}

int Write(dckpt_storage_file* file, uint64_t offset, const void* data, size_t size, void* user_data) {
  HostStore* s = StoreOf(user_data);
  InFlight hold(s);
  if (s->fail_writes_after.load() == 0) return DCKPT_ENOSPC;
  if (s->fail_writes_after.load() > 0) --s->fail_writes_after;
  // A store's latency: large writes take a while, so that the engine's parallel writes visibly overlap.
  if (size >= (1 << 20)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto* f = static_cast<HostFile*>(file);
  std::lock_guard<std::mutex> lock(f->mu);
  if (f->data.size() < offset + size) f->data.resize(offset + size);
  std::memcpy(&f->data[offset], data, size);
  return 0;
}

int Close(dckpt_storage_file* file, uint64_t size, int discard, void* user_data) {
  std::unique_ptr<HostFile> f(static_cast<HostFile*>(file));
  if (discard) return 0;
  f->data.resize(size);
  HostStore* s = StoreOf(user_data);
  std::lock_guard<std::mutex> lock(s->mu);
  s->objects[f->path] = std::move(f->data);
  return 0;
}

int Size(uint64_t* size, const char* path, void* user_data) {
  HostStore* s = StoreOf(user_data);
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->objects.find(path);
  if (it == s->objects.end()) return DCKPT_ENOTFOUND;
  *size = it->second.size();
  return 0;
}

int Read(size_t* got, const char* path, uint64_t offset, void* data, size_t size, void* user_data) {
  HostStore* s = StoreOf(user_data);
  InFlight hold(s);
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->objects.find(path);
  if (it == s->objects.end()) return DCKPT_ENOTFOUND;
  *got = offset >= it->second.size() ? 0 : std::min<uint64_t>(size, it->second.size() - offset);
  std::memcpy(data, it->second.data() + offset, *got);
  return 0;
}

int List(dckpt_storage_list* out, const char* dir, void* user_data) {
  HostStore* s = StoreOf(user_data);
  std::lock_guard<std::mutex> lock(s->mu);
  const std::string prefix = std::string(dir) + "/";
  for (const auto& kv : s->objects) {
    if (kv.first.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = kv.first.substr(prefix.size());
    if (int rc = dckpt_storage_list_add(out, rest.substr(0, rest.find('/')).c_str())) return rc;
  }
  return 0;
}

int Remove(const char* path, void* user_data) {
  HostStore* s = StoreOf(user_data);
  std::lock_guard<std::mutex> lock(s->mu);
  s->objects.erase(path);
  return 0;
}

int Commit(const char* path, const void* data, size_t size, int replace, void* user_data) {
  HostStore* s = StoreOf(user_data);
  ++s->commits;
  std::lock_guard<std::mutex> lock(s->mu);
  if (!replace && s->objects.count(path)) return DCKPT_EEXISTS;
  s->objects[path] = std::string(static_cast<const char*>(data), size);
  return 0;
}

dckpt_storage_callbacks Callbacks(HostStore* store, unsigned max_in_flight) {
  dckpt_storage_callbacks cb;
  EXPECT_EQ(dckpt_storage_callbacks_init(&cb, DCKPT_STORAGE_CALLBACKS_VERSION), 0);
  cb.create = Create;
  cb.write = Write;
  cb.close = Close;
  cb.size = Size;
  cb.read = Read;
  cb.list = List;
  cb.remove = Remove;
  cb.commit = Commit;
  cb.user_data = store;
  cb.max_in_flight = max_in_flight;
  return cb;
}

// A dckpt_storage over a HostStore that lives as long as the storage does.
std::shared_ptr<dckpt_storage> NewCallbackStorage(std::shared_ptr<HostStore> store, unsigned max_in_flight = 0) {
  const dckpt_storage_callbacks cb = Callbacks(store.get(), max_in_flight);
  dckpt_storage* s = nullptr;
  EXPECT_EQ(dckpt_storage_new_callbacks(&s, &cb), 0) << dckpt_error_last();
  return std::shared_ptr<dckpt_storage>(s, [store](dckpt_storage* p) { dckpt_storage_free(p); });
}

std::shared_ptr<Storage> MakeCallbackStorage() {
  std::shared_ptr<dckpt_storage> s = NewCallbackStorage(std::make_shared<HostStore>());
  // The C++ Storage behind the handle, keeping the handle (and so the host store) alive.
  return std::shared_ptr<Storage>(s, s->storage.get());
}

INSTANTIATE_TEST_SUITE_P(Callbacks, StorageConformanceTest,
                         ::testing::Values(StorageConformanceParams{"callbacks", MakeCallbackStorage,
                                                                    [](Storage*) { return std::string("bkt/root"); }}),
                         StorageConformanceTestName);

// ---- Checkpoints through the C ABI ------------------------------------------------------------------------------

constexpr uint64_t kRows = 1024, kCols = 4096;  // 16 MiB of f32: several write segments, so writes overlap

std::vector<float> Values() {
  std::vector<float> v(kRows * kCols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 100003) * 0.25f;
  return v;
}

int SaveTo(const char* path, dckpt_storage* storage, const std::vector<float>& w, int overwrite = 0) {
  dckpt_state* state = nullptr;
  EXPECT_EQ(dckpt_state_new(&state), 0);
  const uint64_t shape[2] = {kRows, kCols}, off[2] = {0, 0};
  EXPECT_EQ(dckpt_state_add_tensor(state, "w", DCKPT_DTYPE_F32, 2, shape), 0);
  // Two row pieces, as two ranks' shards would be.
  const uint64_t half[2] = {kRows / 2, kCols}, off2[2] = {kRows / 2, 0};
  EXPECT_EQ(dckpt_state_add_piece_const(state, "w", off, half, w.data()), 0);
  EXPECT_EQ(dckpt_state_add_piece_const(state, "w", off2, half, w.data() + w.size() / 2), 0);
  dckpt_save_options so;
  EXPECT_EQ(dckpt_save_options_init(&so, DCKPT_SAVE_OPTIONS_VERSION), 0);
  so.storage = storage;
  so.io_threads = 4;
  so.overwrite = overwrite;
  const int rc = dckpt_save(nullptr, path, state, nullptr, &so);
  dckpt_state_free(state);
  return rc;
}

dckpt_read_options ReadOpts(dckpt_storage* storage) {
  dckpt_read_options ro;
  EXPECT_EQ(dckpt_read_options_init(&ro, DCKPT_READ_OPTIONS_VERSION), 0);
  ro.storage = storage;
  ro.io_threads = 4;
  return ro;
}

std::vector<std::string> Names(HostStore* store) {
  std::lock_guard<std::mutex> lock(store->mu);
  std::vector<std::string> out;
  for (const auto& kv : store->objects) out.push_back(kv.first);
  return out;
}

TEST(CallbackStorageTest, SaveLoadReshardVerifyAndExportThroughTheHostsCallbacks) {
  auto store = std::make_shared<HostStore>();
  std::shared_ptr<dckpt_storage> storage = NewCallbackStorage(store, 2);
  const std::vector<float> w = Values();
  ASSERT_EQ(SaveTo("bkt/ckpts/step-1", storage.get(), w), 0) << dckpt_error_last();
  // Writes were parallel, and never more than max_in_flight at once.
  EXPECT_EQ(store->max_seen.load(), 2);
  EXPECT_EQ(store->commits.load(), 1);
  // Only nonce-named data, and the metadata: no marker, nothing renamed.
  const std::vector<std::string> names = Names(store.get());
  ASSERT_EQ(names.size(), 2u);
  std::string nonce;
  EXPECT_TRUE(ParseNoncedFileName(names[0].substr(names[0].rfind('/') + 1), &nonce)) << names[0];
  EXPECT_EQ(names[1], "bkt/ckpts/step-1/metadata.dckpt");

  // Resharded: a column block, as a rank of another layout would read it.
  store->max_seen = 0;
  dckpt_read_options ro = ReadOpts(storage.get());
  dckpt_state* state = nullptr;
  ASSERT_EQ(dckpt_state_new(&state), 0);
  const uint64_t shape[2] = {kRows, kCols}, off[2] = {0, kCols / 4}, len[2] = {kRows, kCols / 2};
  std::vector<float> cols(kRows * kCols / 2);
  ASSERT_EQ(dckpt_state_add_tensor(state, "w", DCKPT_DTYPE_F32, 2, shape), 0);
  ASSERT_EQ(dckpt_state_add_piece(state, "w", off, len, cols.data()), 0);
  ASSERT_EQ(dckpt_load(nullptr, "bkt/ckpts/step-1", state, nullptr, &ro), 0) << dckpt_error_last();
  dckpt_state_free(state);
  for (uint64_t r = 0; r < kRows; r += 97) {
    for (uint64_t c = 0; c < kCols / 2; c += 13) ASSERT_EQ(cols[r * kCols / 2 + c], w[r * kCols + kCols / 4 + c]);
  }
  EXPECT_LE(store->max_seen.load(), 2);

  // The reader keeps the storage alive after the caller frees its handle.
  dckpt_reader* reader = nullptr;
  ASSERT_EQ(dckpt_reader_open(&reader, "bkt/ckpts/step-1", nullptr, &ro), 0) << dckpt_error_last();
  // (The host keeps its callbacks' user_data valid until then, as the header asks.)
  std::weak_ptr<Storage> alive = storage->storage;
  storage.reset();
  ASSERT_FALSE(alive.expired());
  EXPECT_EQ(dckpt_reader_verify(reader, nullptr, nullptr), 0) << dckpt_error_last();
  dckpt_reader_free(reader);
  EXPECT_TRUE(alive.expired());
}

TEST(CallbackStorageTest, AnAsyncSaveKeepsItsStorageUntilTheFutureIsFreed) {
  // The caller frees the storage, then the future without waiting: the future's destructor waits for the background
  // save, which still writes through the storage (ASan would see a use after free).
  auto store = std::make_shared<HostStore>();
  std::shared_ptr<dckpt_storage> storage = NewCallbackStorage(store);
  const std::vector<float> w = Values();
  dckpt_state* state = nullptr;
  ASSERT_EQ(dckpt_state_new(&state), 0);
  const uint64_t shape[2] = {kRows, kCols}, off[2] = {0, 0};
  ASSERT_EQ(dckpt_state_add_tensor(state, "w", DCKPT_DTYPE_F32, 2, shape), 0);
  ASSERT_EQ(dckpt_state_add_piece_const(state, "w", off, shape, w.data()), 0);
  dckpt_save_options so;
  ASSERT_EQ(dckpt_save_options_init(&so, DCKPT_SAVE_OPTIONS_VERSION), 0);
  so.storage = storage.get();
  dckpt_save_future* future = nullptr;
  ASSERT_EQ(dckpt_save_async(&future, "bkt/async", state, nullptr, &so), 0) << dckpt_error_last();
  dckpt_state_free(state);
  storage.reset();
  dckpt_save_future_free(future);
  std::lock_guard<std::mutex> lock(store->mu);
  EXPECT_EQ(store->objects.count("bkt/async/metadata.dckpt"), 1u);
}

TEST(CallbackStorageTest, DamagedDataIsDetectedAndNamed) {
  auto store = std::make_shared<HostStore>();
  std::shared_ptr<dckpt_storage> storage = NewCallbackStorage(store);
  ASSERT_EQ(SaveTo("bkt/c", storage.get(), Values()), 0) << dckpt_error_last();
  const std::string data = Names(store.get())[0];
  {
    std::lock_guard<std::mutex> lock(store->mu);
    store->objects[data][12345] ^= 1;
  }
  dckpt_read_options ro = ReadOpts(storage.get());
  dckpt_reader* reader = nullptr;
  ASSERT_EQ(dckpt_reader_open(&reader, "bkt/c", nullptr, &ro), 0) << dckpt_error_last();
  EXPECT_EQ(dckpt_reader_verify(reader, nullptr, nullptr), DCKPT_ECORRUPT);
  EXPECT_NE(std::string(dckpt_error_last()).find(data.substr(data.rfind('/') + 1)), std::string::npos)
      << dckpt_error_last();
  dckpt_reader_free(reader);
  // A truncated object is named too.
  {
    std::lock_guard<std::mutex> lock(store->mu);
    store->objects[data].resize(1000);
  }
  ASSERT_EQ(dckpt_reader_open(&reader, "bkt/c", nullptr, &ro), 0) << dckpt_error_last();
  EXPECT_EQ(dckpt_reader_verify(reader, nullptr, nullptr), DCKPT_ECORRUPT);
  EXPECT_NE(std::string(dckpt_error_last()).find("truncated"), std::string::npos) << dckpt_error_last();
  dckpt_reader_free(reader);
}

TEST(CallbackStorageTest, AFailedSaveLeavesNothingAndAnOverwriteKeepsTheOldCheckpointUntilItCommits) {
  auto store = std::make_shared<HostStore>();
  std::shared_ptr<dckpt_storage> storage = NewCallbackStorage(store);
  const std::vector<float> w = Values();
  ASSERT_EQ(SaveTo("bkt/c", storage.get(), w), 0) << dckpt_error_last();
  const std::vector<std::string> before = Names(store.get());
  // The storage fills up mid-save: the error names the checkpoint, the old one is untouched, nothing else is left.
  store->fail_writes_after = 1;
  EXPECT_EQ(SaveTo("bkt/c", storage.get(), w, /*overwrite=*/1), DCKPT_ENOSPC);
  EXPECT_NE(std::string(dckpt_error_last()).find("bkt/c"), std::string::npos) << dckpt_error_last();
  EXPECT_EQ(Names(store.get()), before);
  // Without overwrite: EEXISTS before anything is written.
  store->fail_writes_after = -1;
  EXPECT_EQ(SaveTo("bkt/c", storage.get(), w), DCKPT_EEXISTS);
  EXPECT_EQ(Names(store.get()), before);
  // With it, the new checkpoint replaces the old one's files.
  ASSERT_EQ(SaveTo("bkt/c", storage.get(), w, 1), 0) << dckpt_error_last();
  const std::vector<std::string> after = Names(store.get());
  ASSERT_EQ(after.size(), 2u);
  EXPECT_NE(after[0], before[0]);
}

TEST(CallbackStorageTest, ACrashedSaveIsNoCheckpointAndItsLeftoversArePruned) {
  auto store = std::make_shared<HostStore>();
  std::shared_ptr<dckpt_storage> storage = NewCallbackStorage(store);
  ASSERT_EQ(SaveTo("bkt/c", storage.get(), Values()), 0) << dckpt_error_last();
  // What a save killed after writing data leaves: its marker (a writer that has exited) and a nonce-named data file.
  {
    std::lock_guard<std::mutex> lock(store->mu);
    store->objects["bkt/d/STAGING.00000000000000aa"] =
        "distckpt staging directory (not committed)\nhost: elsewhere\npid: 1\nstarted_utc: 2020-01-01T00:00:00Z\n";
    store->objects["bkt/d/data-00000.00000000000000aa.bin"] = std::string(100, 'x');
    store->objects["bkt/d/notes.txt"] = "not ours";
    // And one next to the committed checkpoint: an overwrite that died.
    store->objects["bkt/c/STAGING.00000000000000bb"] =
        "distckpt staging directory (not committed)\nhost: elsewhere\npid: 1\nstarted_utc: 2020-01-01T00:00:00Z\n";
    store->objects["bkt/c/data-00001.00000000000000bb.bin"] = std::string(10, 'y');
  }
  dckpt_read_options ro = ReadOpts(storage.get());
  dckpt_reader* reader = nullptr;
  EXPECT_EQ(dckpt_reader_open(&reader, "bkt/d", nullptr, &ro), DCKPT_ENOTFOUND);
  dckpt_path_info info = DCKPT_PATH_INFO_INIT;
  ASSERT_EQ(dckpt_storage_stat(&info, storage.get(), "bkt/d", 3600), 0) << dckpt_error_last();
  EXPECT_EQ(info.kind, DCKPT_PATH_INCOMPLETE);
  EXPECT_EQ(info.files, 2u);  // notes.txt is not distckpt's
  EXPECT_EQ(info.leftover_files, 2u);
  ASSERT_EQ(dckpt_storage_stat(&info, storage.get(), "bkt/c", 3600), 0) << dckpt_error_last();
  EXPECT_EQ(info.kind, DCKPT_PATH_CHECKPOINT);
  EXPECT_EQ(info.leftover_files, 2u);

  // A marker younger than the grace period is a save in progress: kept.
  {
    std::lock_guard<std::mutex> lock(store->mu);
    store->objects["bkt/c/STAGING.00000000000000cc"] = StagingMarkerText("bkt/c");
    store->objects["bkt/c/data-00000.00000000000000cc.bin"] = "running";
  }
  std::vector<std::string> removed;
  auto record = [](const char* p, void* user) {
    static_cast<std::vector<std::string>*>(user)->push_back(p);
    return 0;
  };
  ASSERT_EQ(dckpt_storage_remove_leftovers(storage.get(), "bkt/c", 3600, /*dry_run=*/1, record, &removed), 0);
  EXPECT_EQ(removed, std::vector<std::string>({"bkt/c/data-00001.00000000000000bb.bin", "bkt/c/STAGING.00000000000000bb"}));
  ASSERT_EQ(dckpt_storage_remove_leftovers(storage.get(), "bkt/c", 3600, 0, nullptr, nullptr), 0);
  ASSERT_EQ(dckpt_storage_remove_leftovers(storage.get(), "bkt/d", 3600, 0, nullptr, nullptr), 0);
  std::vector<std::string> names = Names(store.get());
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.find("00000000000000bb") != n.npos; }), 0);
  EXPECT_NE(std::find(names.begin(), names.end(), "bkt/c/data-00000.00000000000000cc.bin"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "bkt/d/notes.txt"), names.end());
  ASSERT_EQ(dckpt_reader_open(&reader, "bkt/c", nullptr, &ro), 0) << dckpt_error_last();
  EXPECT_EQ(dckpt_reader_verify(reader, nullptr, nullptr), 0) << dckpt_error_last();
  dckpt_reader_free(reader);

  // Removing the checkpoint: metadata first, then its files; the running save's files and foreign files stay.
  ASSERT_EQ(dckpt_storage_remove_checkpoint(storage.get(), "bkt/c"), 0) << dckpt_error_last();
  names = Names(store.get());
  EXPECT_EQ(names, std::vector<std::string>({"bkt/c/STAGING.00000000000000cc", "bkt/c/data-00000.00000000000000cc.bin",
                                             "bkt/d/notes.txt"}));
  EXPECT_EQ(dckpt_storage_remove_checkpoint(storage.get(), "bkt/nothing"), DCKPT_ENOTFOUND);
}

TEST(CallbackStorageTest, MissingCallbacksAndHostErrorsAreReported) {
  dckpt_storage_callbacks cb = DCKPT_STORAGE_CALLBACKS_INIT;
  dckpt_storage* s = nullptr;
  EXPECT_EQ(dckpt_storage_new_callbacks(&s, &cb), DCKPT_EINVAL);
  EXPECT_NE(std::string(dckpt_error_last()).find("callbacks->create"), std::string::npos);
  auto store = std::make_shared<HostStore>();
  cb = Callbacks(store.get(), 0);
  cb.read = [](size_t*, const char*, uint64_t, void*, size_t, void*) { return 42; };  // not a DCKPT code
  ASSERT_EQ(dckpt_storage_new_callbacks(&s, &cb), 0);
  ASSERT_EQ(SaveTo("bkt/e", s, Values()), 0) << dckpt_error_last();
  dckpt_read_options ro = ReadOpts(s);
  dckpt_reader* reader = nullptr;
  EXPECT_EQ(dckpt_reader_open(&reader, "bkt/e", nullptr, &ro), DCKPT_EUSER);
  EXPECT_NE(std::string(dckpt_error_last()).find("bkt/e/metadata.dckpt"), std::string::npos) << dckpt_error_last();
  dckpt_storage_free(s);
}

// ---- Version 2: multipart uploads assembled by distckpt --------------------------------------------------------

struct HostUploads {
  HostStore* store;
  std::mutex mu;
  std::atomic<int> begun{0}, completed{0}, aborted{0}, open{0}, released{0};
  std::atomic<int> fail_part{0};  // > 0: that part number fails with DCKPT_EIO
  std::vector<std::pair<unsigned, size_t>> parts;  // every part sent: (number, size)
};

struct HostUpload {
  std::string path;
  std::mutex mu;
  std::map<unsigned, std::string> parts;
};

HostUploads* UploadsOf(void* user_data) { return static_cast<HostUploads*>(user_data); }

dckpt_storage_callbacks MultipartCallbacks(HostUploads* uploads, uint64_t min_part) {
  dckpt_storage_callbacks cb = Callbacks(uploads->store, 0);
  // The v1 callbacks take the HostStore; route them through HostUploads (its first member).
  cb.user_data = uploads;
  cb.create = [](dckpt_storage_file** f, const char* p, uint64_t h, void* u) {
    return Create(f, p, h, UploadsOf(u)->store);
  };
  cb.write = [](dckpt_storage_file* f, uint64_t o, const void* d, size_t n, void* u) {
    return Write(f, o, d, n, UploadsOf(u)->store);
  };
  cb.close = [](dckpt_storage_file* f, uint64_t n, int discard, void* u) {
    return Close(f, n, discard, UploadsOf(u)->store);
  };
  cb.size = [](uint64_t* n, const char* p, void* u) { return Size(n, p, UploadsOf(u)->store); };
  cb.read = [](size_t* g, const char* p, uint64_t o, void* d, size_t n, void* u) {
    return Read(g, p, o, d, n, UploadsOf(u)->store);
  };
  cb.list = [](dckpt_storage_list* l, const char* d, void* u) { return List(l, d, UploadsOf(u)->store); };
  cb.remove = [](const char* p, void* u) { return Remove(p, UploadsOf(u)->store); };
  cb.commit = [](const char* p, const void* d, size_t n, int r, void* u) {
    return Commit(p, d, n, r, UploadsOf(u)->store);
  };
  cb.upload_begin = [](dckpt_upload** up, const char* path, uint64_t, void* u) {
    ++UploadsOf(u)->begun;
    ++UploadsOf(u)->open;
    *up = new HostUpload{path, {}, {}};
    return 0;
  };
  cb.upload_part = [](dckpt_upload* up, unsigned number, const void* data, size_t size, void* u) -> int {
    HostUploads* h = UploadsOf(u);
    {
      std::lock_guard<std::mutex> lock(h->mu);
      h->parts.emplace_back(number, size);
    }
    if (h->fail_part.load() == static_cast<int>(number)) return DCKPT_EIO;
    auto* f = static_cast<HostUpload*>(up);
    std::lock_guard<std::mutex> lock(f->mu);
    f->parts[number] = std::string(static_cast<const char*>(data), size);
    return 0;
  };
  cb.upload_complete = [](dckpt_upload* up, void* u) -> int {
    std::unique_ptr<HostUpload> f(static_cast<HostUpload*>(up));
    HostUploads* h = UploadsOf(u);
    std::string object;
    unsigned next = 1;
    for (const auto& kv : f->parts) {
      if (kv.first != next++) return DCKPT_EINVAL;
      object += kv.second;
    }
    ++h->completed;
    --h->open;
    std::lock_guard<std::mutex> lock(h->store->mu);
    h->store->objects[f->path] = std::move(object);
    return 0;
  };
  cb.upload_abort = [](dckpt_upload* up, void* u) {
    delete static_cast<HostUpload*>(up);
    ++UploadsOf(u)->aborted;
    --UploadsOf(u)->open;
    return 0;
  };
  cb.min_part_size = min_part;
  cb.release = [](void* u) { ++UploadsOf(u)->released; };
  return cb;
}

TEST(CallbackStorageTest, MultipartUploadsAreAssembledByDistckpt) {
  auto store = std::make_shared<HostStore>();
  HostUploads uploads;
  uploads.store = store.get();
  const uint64_t part = 1 << 20;
  const dckpt_storage_callbacks cb = MultipartCallbacks(&uploads, part);
  dckpt_storage* s = nullptr;
  ASSERT_EQ(dckpt_storage_new_callbacks(&s, &cb), 0) << dckpt_error_last();
  const std::vector<float> w = Values();
  ASSERT_EQ(SaveTo("bkt/mp", s, w), 0) << dckpt_error_last();
  // The one data file (16 MiB and a little) went up in parts of 1 MiB, numbered from 1; the metadata did not.
  EXPECT_EQ(uploads.begun.load(), 1);
  EXPECT_EQ(uploads.completed.load(), 1);
  EXPECT_EQ(uploads.open.load(), 0);
  size_t data_size = 0;
  for (const std::string& name : Names(store.get())) {
    if (name.find("/data-") != std::string::npos) data_size = store->objects[name].size();
  }
  ASSERT_GE(data_size, w.size() * sizeof(float));
  {
    std::lock_guard<std::mutex> lock(uploads.mu);
    const size_t n = (data_size + part - 1) / part;
    ASSERT_EQ(uploads.parts.size(), n);
    std::vector<unsigned> numbers;
    for (const auto& [number, size] : uploads.parts) {
      numbers.push_back(number);
      EXPECT_EQ(size, number < n ? part : data_size - (n - 1) * part);
    }
    std::sort(numbers.begin(), numbers.end());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(numbers[i], i + 1);
  }
  // It loads and verifies like any checkpoint.
  dckpt_read_options ro = ReadOpts(s);
  dckpt_reader* reader = nullptr;
  ASSERT_EQ(dckpt_reader_open(&reader, "bkt/mp", nullptr, &ro), 0) << dckpt_error_last();
  EXPECT_EQ(dckpt_reader_verify(reader, nullptr, nullptr), 0) << dckpt_error_last();
  std::vector<float> back(w.size());
  dckpt_state* state = nullptr;
  ASSERT_EQ(dckpt_state_new(&state), 0);
  const uint64_t shape[2] = {kRows, kCols}, off[2] = {0, 0};
  ASSERT_EQ(dckpt_state_add_tensor(state, "w", DCKPT_DTYPE_F32, 2, shape), 0);
  ASSERT_EQ(dckpt_state_add_piece(state, "w", off, shape, back.data()), 0);
  ASSERT_EQ(dckpt_load(nullptr, "bkt/mp", state, nullptr, &ro), 0) << dckpt_error_last();
  dckpt_state_free(state);
  EXPECT_TRUE(back == w);

  // A part that fails fails the save, aborts the upload and leaves no data file.
  uploads.fail_part = 3;
  EXPECT_EQ(SaveTo("bkt/mp-failed", s, w), DCKPT_EIO);
  EXPECT_NE(std::string(dckpt_error_last()).find("upload_part"), std::string::npos) << dckpt_error_last();
  EXPECT_EQ(uploads.aborted.load(), 1);
  EXPECT_EQ(uploads.open.load(), 0);
  for (const std::string& name : Names(store.get())) EXPECT_EQ(name.find("bkt/mp-failed"), std::string::npos) << name;

  // release runs once, when the caller's handle and the reader using the storage are both gone.
  dckpt_storage_free(s);
  EXPECT_EQ(uploads.released.load(), 0);
  dckpt_reader_free(reader);
  EXPECT_EQ(uploads.released.load(), 1);
}

TEST(CallbackStorageTest, Version1CallbacksAreReadAsVersion1) {
  // A caller built against version 1 has the shorter struct: init writes only its fields, and new reads only them
  // (the bytes after it, poison here, are not the upload callbacks).
  const size_t v1 = offsetof(dckpt_storage_callbacks, upload_begin);
  std::vector<unsigned char> raw(sizeof(dckpt_storage_callbacks) + 16, 0xA5);
  auto* cb = reinterpret_cast<dckpt_storage_callbacks*>(raw.data());
  ASSERT_EQ(dckpt_storage_callbacks_init(cb, 1), 0);
  for (size_t i = v1; i < raw.size(); ++i) ASSERT_EQ(raw[i], 0xA5) << "byte " << i << " written by init(1)";
  EXPECT_EQ(cb->version, 1u);
  auto store = std::make_shared<HostStore>();
  const dckpt_storage_callbacks full = Callbacks(store.get(), 0);
  std::memcpy(raw.data() + sizeof(unsigned), reinterpret_cast<const unsigned char*>(&full) + sizeof(unsigned),
              v1 - sizeof(unsigned));
  dckpt_storage* s = nullptr;
  ASSERT_EQ(dckpt_storage_new_callbacks(&s, cb), 0) << dckpt_error_last();
  const int creates = store->creates.load();
  ASSERT_EQ(SaveTo("bkt/v1", s, Values()), 0) << dckpt_error_last();
  EXPECT_GE(store->creates.load(), creates + 1);  // the data file through create/write/close, as before
  dckpt_storage_free(s);
  // The version-2 defaults: no upload callbacks, no release.
  dckpt_storage_callbacks v2;
  ASSERT_EQ(dckpt_storage_callbacks_init(&v2, 2), 0);
  EXPECT_EQ(v2.upload_begin, nullptr);
  EXPECT_EQ(v2.min_part_size, 0u);
  EXPECT_EQ(v2.release, nullptr);
}

TEST(CallbackStorageTest, UploadCallbacksGoTogether) {
  auto store = std::make_shared<HostStore>();
  HostUploads uploads;
  uploads.store = store.get();
  dckpt_storage_callbacks cb = MultipartCallbacks(&uploads, 0);
  cb.upload_abort = nullptr;
  dckpt_storage* s = nullptr;
  EXPECT_EQ(dckpt_storage_new_callbacks(&s, &cb), DCKPT_EINVAL);
  EXPECT_NE(std::string(dckpt_error_last()).find("upload_abort"), std::string::npos) << dckpt_error_last();
  EXPECT_EQ(uploads.released.load(), 0);  // not on failure
}

}  // namespace
}  // namespace distckpt

// dckpt_storage_read_file and dckpt_storage_list_dir on any storage: the size asked first, then the bytes.
TEST(CallbackStorageTest, SmallFilesAreReadAndListedThroughAnyStorage) {
  dckpt_storage* mem = nullptr;
  ASSERT_EQ(dckpt_storage_new_memory(&mem), DCKPT_OK);
  std::unique_ptr<dckpt_storage, void (*)(dckpt_storage*)> hold(mem, dckpt_storage_free);
  ASSERT_TRUE(mem->storage->WriteFileDurably("bkt/run/notes.json", "{\"step\": 7}").ok());
  uint64_t size = 99;
  EXPECT_EQ(dckpt_storage_read_file(&size, mem, "bkt/run/notes.json", nullptr, 0), DCKPT_EBUFSIZE);
  EXPECT_EQ(size, 11u);
  EXPECT_NE(std::string(dckpt_error_last()).find("bkt/run/notes.json"), std::string::npos) << dckpt_error_last();
  char small[4];
  EXPECT_EQ(dckpt_storage_read_file(&size, mem, "bkt/run/notes.json", small, sizeof(small)), DCKPT_EBUFSIZE);
  std::string buf(size, '\0');
  ASSERT_EQ(dckpt_storage_read_file(&size, mem, "bkt/run/notes.json", &buf[0], buf.size()), DCKPT_OK);
  EXPECT_EQ(buf, "{\"step\": 7}");
  EXPECT_EQ(dckpt_storage_read_file(&size, mem, "bkt/run/none", &buf[0], buf.size()), DCKPT_ENOTFOUND);
  EXPECT_NE(std::string(dckpt_error_last()).find("bkt/run/none"), std::string::npos) << dckpt_error_last();
  std::vector<std::string> names;
  auto collect = [](const char* name, void* user) {
    static_cast<std::vector<std::string>*>(user)->push_back(name);
    return 0;
  };
  ASSERT_EQ(dckpt_storage_list_dir(mem, "bkt", collect, &names), DCKPT_OK);
  EXPECT_EQ(names, std::vector<std::string>{"run"});
  size_t scheme = 99;
  ASSERT_EQ(dckpt_url_scheme(&scheme, "s3://b/k"), DCKPT_OK);
  EXPECT_EQ(scheme, 2u);
  ASSERT_EQ(dckpt_url_scheme(&scheme, "/data/run://x"), DCKPT_OK);
  EXPECT_EQ(scheme, 0u);
  ASSERT_EQ(dckpt_url_scheme(&scheme, "9p://x"), DCKPT_OK);
  EXPECT_EQ(scheme, 0u);
  // A URL of a scheme nobody serves, with no storage: unsupported, naming it.
  EXPECT_EQ(dckpt_storage_read_file(&size, nullptr, "gs://b/x", nullptr, 0), DCKPT_EUNSUPPORTED);
  EXPECT_NE(std::string(dckpt_error_last()).find("gs://"), std::string::npos) << dckpt_error_last();
}
