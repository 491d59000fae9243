// distckpt._distckpt.Reader: an open checkpoint (info, entries, chunks, reads into host buffers or device memory,
// bytes entries, verification, a load through it), readable from several Python threads at once.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings/binding_util.h"
#include "bindings/calls.h"
#include "bindings/comm.h"
#include "bindings/register.h"
#include "bindings/state.h"
#include "bindings/storage.h"

namespace distckpt_python {
namespace {

/// An open checkpoint. Reads may run concurrently from several Python threads (the GIL is released during each);
/// close() waits for them.
class Reader {
 public:
  static std::unique_ptr<Reader> Open(const std::string& path, std::shared_ptr<Comm> comm, bool verify,
                                      unsigned io_threads, uint64_t timeout_ms, bool map_files, bool share_verification,
                                      bool pin_files, int fanout, std::shared_ptr<Storage> storage) {
    dckpt_read_options o = ReadOptions(verify, io_threads, timeout_ms, nullptr, map_files, share_verification);
    o.pin_files = pin_files ? 1 : 0;
    o.fanout = fanout;
    auto call = std::make_unique<StorageCall>(std::move(storage));
    o.storage = call->get();
    Comm::Use use(comm);
    dckpt_comm* c = use.get();
    dckpt_reader* r = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = dckpt_reader_open(&r, path.c_str(), c, &o);
    }
    CheckCall(rc, nullptr, comm, call.get());
    return std::unique_ptr<Reader>(new Reader(r, std::move(call)));
  }
  ~Reader() {
    py::gil_scoped_release nogil;  // plugged-in storage may take the GIL while the reader lets go of its files
    dckpt_reader_free(reader_);
  }

  /// Closes; while arrays mapped from the files are alive (MapChunk), the native reader, and so its mappings, stays
  /// until the last of them goes: the Python reader is closed either way.
  void Close() {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(mu_);
    closed_ = true;
    if (pins_ == 0) {
      dckpt_reader_free(reader_);
      reader_ = nullptr;
    }
  }
  bool closed() const { return closed_; }

  /// Pages in, maps and (when the reader verifies) checks every chunk of `entries` (every entry when None):
  /// dckpt_map_all.
  void MapAll(std::optional<std::vector<size_t>> entries, py::object progress) {
    auto prog = MakeProgress(progress);
    dckpt_map_all_options o = DCKPT_MAP_ALL_OPTIONS_INIT;
    if (entries) {
      o.entries = entries->data();
      o.num_entries = entries->size();
    }
    o.progress = prog ? &ProgressTrampoline : nullptr;
    o.progress_user_data = prog.get();
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) rc = dckpt_reader_map_all(reader_, &o);
    }
    if (rc == kClosed) CheckOpen(rc, mark);
    CheckCall(rc, prog.get(), nullptr, storage_.get(), mark);
  }

  /// The bytes of chunk `chunk` of entry `entry` where the reader maps its data file (dckpt_reader_map_chunk), as a
  /// read-only buffer that keeps the mapping alive however long it lives, even past close().
  py::object MapChunk(py::object self, size_t entry, size_t chunk);

  void Unpin() {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (--pins_ == 0 && closed_ && reader_ != nullptr) {
      dckpt_reader_free(reader_);
      reader_ = nullptr;
    }
  }

  py::dict Info() {
    Locked r = Acquire();
    dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
    Check(dckpt_reader_info(&info, r.reader));
    py::dict d;
    d["format_major"] = info.format_major;
    d["format_minor"] = info.format_minor;
    d["writer"] = std::string(info.writer ? info.writer : "");
    d["num_entries"] = info.num_entries;
    d["num_files"] = info.num_files;
    d["total_bytes"] = info.total_bytes;
    d["metadata_bytes"] = info.metadata_bytes;
    d["checksum_block_size"] = info.checksum_block_size;
    d["source"] = std::string(info.source ? info.source : "");
    d["checksummed"] = info.checksummed != 0;
    d["source_version"] = std::string(info.source_version ? info.source_version : "");
    py::list bases;
    for (size_t k = 0; k < info.num_bases; ++k) {
      const char* name = nullptr;
      Check(dckpt_reader_base(&name, r.reader, k));
      bases.append(std::string(name));
    }
    d["bases"] = bases;
    d["chain_length"] = info.chain_length;
    d["bytes_in_bases"] = info.bytes_in_bases;
    d["stored_bytes"] = info.stored_bytes;
    d["compressed_chunks"] = info.compressed_chunks;
    return d;
  }

  /// (name, kind, dtype, shape, nbytes, num_chunks) of every entry, in name order.
  py::list Entries() {
    Locked locked = Acquire();
    dckpt_reader* r = locked.reader;
    dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
    Check(dckpt_reader_info(&info, r));
    py::list out;
    for (size_t i = 0; i < info.num_entries; ++i) {
      dckpt_entry_info e = DCKPT_ENTRY_INFO_INIT;
      Check(dckpt_reader_entry(&e, r, i));
      py::tuple shape(e.ndim);
      for (size_t d = 0; d < e.ndim; ++d) shape[d] = py::int_(e.shape[d]);
      out.append(py::make_tuple(py::str(e.name), e.kind, e.dtype, shape, e.nbytes, e.num_chunks));
    }
    return out;
  }

  std::optional<size_t> Find(const std::string& name) {
    Locked r = Acquire();
    size_t index = 0;
    int rc = dckpt_reader_find(&index, r.reader, name.c_str());
    if (rc == DCKPT_ENOTFOUND) return std::nullopt;
    Check(rc);
    return index;
  }

  /// (offsets, lengths, file, file_offset, length, checksum) of chunk `chunk` of entry `entry`.
  py::tuple Chunk(size_t entry, size_t chunk) {
    Locked r = Acquire();
    dckpt_chunk_info c = DCKPT_CHUNK_INFO_INIT;
    Check(dckpt_reader_chunk(&c, r.reader, entry, chunk));
    py::tuple off(c.ndim), len(c.ndim);
    for (size_t d = 0; d < c.ndim; ++d) {
      off[d] = py::int_(c.offsets[d]);
      len[d] = py::int_(c.lengths[d]);
    }
    return py::make_tuple(off, len, py::str(c.file), c.file_offset, c.length, c.checksum, py::str(c.base),
                          c.codec == DCKPT_COMPRESSION_ZSTD ? "zstd" : "none", c.stored_length);
  }

  /// Reads the box [offsets, offsets + lengths) of tensor `name` into the writable C-contiguous buffer `dst`.
  void Read(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
            const py::object& dst) {
    if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
    HeldBuffer buf(dst, /*writable=*/true);
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) {
        rc = dckpt_reader_read(reader_, name.c_str(), offsets.size(), offsets.data(), lengths.data(), buf.data(),
                               buf.size());
      }
    }
    CheckOpen(rc, mark);
  }

  /// Reads the box [offsets, offsets + lengths) of tensor `name` into `nbytes` of CUDA device memory at `ptr` on
  /// `device`, after the work queued on `stream` (0: the legacy default stream); the copies have completed on return.
  void ReadDevice(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
                  uintptr_t ptr, uint64_t nbytes, int device, uintptr_t stream) {
    if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
    dckpt_piece_options o;
    Check(dckpt_piece_options_init(&o, DCKPT_PIECE_OPTIONS_VERSION));
    o.memory = DCKPT_MEMORY_CUDA;
    o.device = device;
    o.stream = reinterpret_cast<void*>(stream);
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) {
        rc = dckpt_reader_read_ex(reader_, name.c_str(), offsets.size(), offsets.data(), lengths.data(),
                                  reinterpret_cast<void*>(ptr), nbytes, &o);
      }
    }
    CheckOpen(rc, mark);
  }

  py::bytes ReadBytes(const std::string& name) {
    uint64_t size = 0;
    {
      Locked r = Acquire();
      // A size query: DCKPT_EBUFSIZE (with the size filled in) is its normal answer for a non-empty entry.
      int rc = dckpt_reader_read_bytes(&size, r.reader, name.c_str(), nullptr, 0);
      if (rc != DCKPT_OK && rc != DCKPT_EBUFSIZE) Raise(rc);
    }
    std::string out(size, '\0');
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) rc = dckpt_reader_read_bytes(&size, reader_, name.c_str(), out.data(), out.size());
    }
    CheckOpen(rc, mark);
    return py::bytes(out.data(), size);
  }

  py::dict User() {
    Locked locked = Acquire();
    dckpt_reader* r = locked.reader;
    size_t n = 0;
    Check(dckpt_reader_num_user(&n, r));
    py::dict d;
    for (size_t i = 0; i < n; ++i) {
      const char* k = nullptr;
      const char* v = nullptr;
      Check(dckpt_reader_user(&k, &v, r, i));
      d[py::str(k)] = py::str(v);
    }
    return d;
  }

  py::bytes Structure() {
    Locked r = Acquire();
    const char* data = nullptr;
    size_t size = 0;
    Check(dckpt_reader_structure(&data, &size, r.reader));
    return py::bytes(data ? data : "", size);
  }

  void Verify(py::object progress) {
    auto prog = MakeProgress(progress);
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) rc = dckpt_reader_verify(reader_, prog ? &ProgressTrampoline : nullptr, prog.get());
    }
    if (rc == kClosed) CheckOpen(rc, mark);
    CheckCall(rc, prog.get(), nullptr, storage_.get(), mark);
  }

  /// Loads a State from the checkpoint this reader opened (collective over `comm`, as it was opened).
  py::dict Load(State& state, std::shared_ptr<Comm> comm, py::object progress) {
    auto prog = MakeProgress(progress);
    dckpt_io_stats stats = DCKPT_IO_STATS_INIT;
    Comm::Use use(comm);
    dckpt_comm* c = use.get();
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) {
        rc = dckpt_reader_load(&stats, reader_, state.get(), c, prog ? &ProgressTrampoline : nullptr, prog.get());
      }
    }
    if (rc == kClosed) CheckOpen(rc, mark);
    CheckCall(rc, prog.get(), comm, storage_.get(), mark);
    return IoStatsDict(stats);
  }

  void VerifyChunk(size_t entry, size_t chunk) {
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!closed_) rc = dckpt_reader_verify_chunk(reader_, entry, chunk);
    }
    CheckOpen(rc, mark);
  }

  py::dict IoStats() {
    Locked r = Acquire();
    dckpt_io_stats s = DCKPT_IO_STATS_INIT;
    Check(dckpt_reader_io_stats(&s, r.reader));
    return IoStatsDict(s);
  }

 private:
  Reader(dckpt_reader* r, std::unique_ptr<StorageCall> storage) : reader_(r), storage_(std::move(storage)) {}

  // Every use of reader_ holds mu_ shared; close() holds it exclusively. Calls that release the GIL drop the lock
  // before taking the GIL back, so the lock and the GIL never wait on each other.
  static constexpr int kClosed = 1;  // not a dckpt status: "the reader was closed under us"
  struct Locked {
    std::shared_lock<std::shared_mutex> lock;
    dckpt_reader* reader;
  };
  Locked Acquire() {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) throw NativeError(DCKPT_ESTATE, "the reader is closed");
    return Locked{std::move(lock), reader_};
  }
  uint64_t Mark() const { return storage_->Mark(); }
  /// Raises for rc != OK (kClosed: the reader was closed), naming what a storage callback raised since `mark`.
  void CheckOpen(int rc, uint64_t mark) const {
    if (rc == kClosed) throw NativeError(DCKPT_ESTATE, "the reader is closed");
    if (rc == DCKPT_OK) return;
    std::string message = dckpt_error_last();
    py::object cause = py::none();
    storage_->Annotate(message, cause, mark);
    throw NativeError(rc, std::move(message), std::move(cause));
  }
  friend class MappedChunk;
  dckpt_reader* reader_;
  bool closed_ = false;  // by close(); reader_ stays while pins_ > 0
  size_t pins_ = 0;      // MappedChunk buffers alive
  std::shared_mutex mu_;
  std::unique_ptr<StorageCall> storage_;  // the storage's callbacks must outlive the reader
};

/// A mapped chunk's bytes, exposed through the buffer protocol (numpy.frombuffer takes them without a copy). Holds
/// the Python reader and a pin on its native reader, so the mapping outlives close() while any view of it lives.
class MappedChunk {
 public:
  MappedChunk(Reader* reader, py::object owner, const void* data, uint64_t size)
      : reader_(reader), owner_(std::move(owner)), data_(data), size_(size) {}
  MappedChunk(const MappedChunk&) = delete;
  MappedChunk& operator=(const MappedChunk&) = delete;
  ~MappedChunk() { reader_->Unpin(); }
  py::buffer_info Buffer() const {
    return py::buffer_info(const_cast<void*>(data_), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(size_)}, {static_cast<py::ssize_t>(1)}, /*readonly=*/true);
  }
  uint64_t size() const { return size_; }

 private:
  Reader* reader_;
  py::object owner_;  // keeps reader_ alive
  const void* data_;
  uint64_t size_;
};

py::object Reader::MapChunk(py::object self, size_t entry, size_t chunk) {
  const void* data = nullptr;
  uint64_t size = 0;
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(mu_);  // exclusive: pins_ changes
    if (closed_) {
      lock.unlock();
      py::gil_scoped_acquire gil;
      throw NativeError(DCKPT_ESTATE, "the reader is closed");
    }
    const int rc = dckpt_reader_map_chunk(&data, &size, reader_, entry, chunk);
    if (rc != DCKPT_OK) {
      std::string message = dckpt_error_last();
      lock.unlock();
      py::gil_scoped_acquire gil;
      throw NativeError(rc, std::move(message));
    }
    ++pins_;
  }
  return py::cast(std::make_unique<MappedChunk>(this, std::move(self), data, size));
}

}  // namespace

void RegisterReader(py::module_& m) {
  py::class_<MappedChunk>(m, "MappedChunk", py::buffer_protocol())
      .def_buffer(&MappedChunk::Buffer)
      .def("__len__", &MappedChunk::size);
  py::class_<Reader>(m, "Reader")
      .def_static("open", &Reader::Open, py::arg("path"), py::arg("comm").none(true), py::arg("verify"),
                  py::arg("io_threads"), py::arg("timeout_ms"), py::arg("map_files") = true,
                  py::arg("share_verification") = true, py::arg("pin_files") = true,
                  py::arg("fanout") = static_cast<int>(DCKPT_FANOUT_AUTO), py::arg("storage").none(true) = nullptr)
      .def("load", &Reader::Load, py::arg("state"), py::arg("comm").none(true), py::arg("progress"))
      .def("close", &Reader::Close)
      .def("map_all", &Reader::MapAll, py::arg("entries").none(true), py::arg("progress"))
      .def(
          "map_chunk",
          [](py::object self, size_t entry, size_t chunk) { return self.cast<Reader&>().MapChunk(self, entry, chunk); },
          py::arg("entry"), py::arg("chunk"))
      .def_property_readonly("closed", &Reader::closed)
      .def("info", &Reader::Info)
      .def("entries", &Reader::Entries)
      .def("find", &Reader::Find, py::arg("name"))
      .def("chunk", &Reader::Chunk, py::arg("entry"), py::arg("chunk"))
      .def("read", &Reader::Read, py::arg("name"), py::arg("offsets"), py::arg("lengths"), py::arg("dst"))
      .def("read_device", &Reader::ReadDevice, py::arg("name"), py::arg("offsets"), py::arg("lengths"), py::arg("ptr"),
           py::arg("nbytes"), py::arg("device"), py::arg("stream"))
      .def("read_bytes", &Reader::ReadBytes, py::arg("name"))
      .def("user", &Reader::User)
      .def("structure", &Reader::Structure)
      .def("verify", &Reader::Verify, py::arg("progress"))
      .def("verify_chunk", &Reader::VerifyChunk, py::arg("entry"), py::arg("chunk"))
      .def("io_stats", &Reader::IoStats);
}

}  // namespace distckpt_python
