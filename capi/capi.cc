// The C ABI over the engine. No C++ exception crosses this boundary; every failure becomes a status code plus a
// per-thread message.
#include "capi/include/distckpt/distckpt.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "capi/capi_internal.h"
#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/base/version.h"
#include "core/cuda/copy_engine.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "core/foreign/foreign.h"

static_assert(DCKPT_VERSION_MAJOR == distckpt::kVersionMajor && DCKPT_VERSION_MINOR == distckpt::kVersionMinor &&
                  DCKPT_VERSION_PATCH == distckpt::kVersionPatch,
              "distckpt.h and core/base/version.h disagree on the version");
static_assert(DCKPT_MAX_DIMS == distckpt::kMaxDims, "DCKPT_MAX_DIMS out of date");
static_assert(DCKPT_EINTERNAL == static_cast<int>(distckpt::StatusCode::kInternal), "status codes out of date");
static_assert(DCKPT_DTYPE_F8_E5M2 == static_cast<int>(distckpt::DType::kF8E5M2), "dtype codes out of date");

// The storage is declared first so that it is destroyed last: the future's destructor waits for the background save,
// and the reader's closes its files, both still using it.
struct dckpt_save_future {
  std::shared_ptr<distckpt::Storage> storage;  // what the save writes to, kept alive until it is freed
  std::unique_ptr<distckpt::SaveFuture> future;
};

struct dckpt_reader {
  std::shared_ptr<distckpt::Storage> storage;  // what the reader reads from, kept alive until it is freed
  std::unique_ptr<distckpt::Reader> reader;
};

namespace distckpt {
namespace capi {
namespace {

thread_local std::string t_error_message;
thread_local int t_error_code = DCKPT_OK;

// A C progress callback as the engine's ProgressFn (empty when `fn` is NULL).
ProgressFn ProgressOf(dckpt_progress_fn fn, void* user_data) {
  if (fn == nullptr) return nullptr;
  return [fn, user_data](uint64_t done, uint64_t total) { return fn(done, total, user_data); };
}

}  // namespace

int Report(const Status& st) {
  if (st.ok()) return DCKPT_OK;
  t_error_code = static_cast<int>(st.code());
  t_error_message = st.message();
  return t_error_code;
}

int ReportException() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Report(Status(StatusCode::kNoMemory, "out of memory"));
  } catch (const std::exception& e) {
    return Report(Internal(std::string("unexpected C++ exception: ") + e.what()));
  } catch (...) {
    return Report(Internal("unexpected C++ exception"));
  }
}

Status CheckVersion(unsigned version, unsigned current, const char* what) {
  if (version == 0)
    return InvalidArgument(std::string(what) + ".version is 0: initialise it with its _INIT macro or _init()");
  if (version > current) {
    return VersionError(std::string(what) + ".version " + std::to_string(version) + " is newer than this library (" +
                        std::to_string(current) + "); link a newer libdistckpt");
  }
  return OkStatus();
}

Status NotNull(const void* p, const char* what) {
  return p ? OkStatus() : InvalidArgument(std::string(what) + " must not be NULL");
}

std::chrono::milliseconds Timeout(uint64_t ms) {
  // Deadlines are now + timeout on steady_clock (nanoseconds in an int64): anything past a century is "forever", and
  // is clamped there so that the sum cannot overflow.
  constexpr uint64_t kCentury = 100ull * 365 * 24 * 3600 * 1000;
  return ms == 0 ? kDefaultCollectiveTimeout : std::chrono::milliseconds(std::min(ms, kCentury));
}

Result<ReadOptions> ToReadOptions(const dckpt_read_options* opts) {
  ReadOptions o;
  if (opts == nullptr) return o;
  DCKPT_RETURN_IF_ERROR(CheckVersion(opts->version, DCKPT_READ_OPTIONS_VERSION, "dckpt_read_options"));
  o.verify = opts->verify != 0;
  o.io_threads = opts->io_threads;
  o.timeout = Timeout(opts->timeout_ms);
  if (opts->version >= 2) o.progress = ProgressOf(opts->progress, opts->progress_user_data);
  if (opts->version >= 3) {
    o.map_files = opts->map_files != 0;
    o.share_verification = opts->share_verification != 0;
  }
  if (opts->version >= 5) {
    switch (opts->fanout) {
      case DCKPT_FANOUT_AUTO:
        o.fanout = FanoutMode::kAuto;
        break;
      case DCKPT_FANOUT_OFF:
        o.fanout = FanoutMode::kOff;
        break;
      case DCKPT_FANOUT_ALWAYS:
        o.fanout = FanoutMode::kAlways;
        break;
      default:
        return InvalidArgument("dckpt_read_options.fanout = " + std::to_string(opts->fanout) +
                               " is not a dckpt_fanout_mode");
    }
    if (opts->fanout_round_bytes != 0) o.fanout_round_bytes = opts->fanout_round_bytes;
  }
  if (opts->version >= 6) {
    if (opts->staging_buffer_bytes != 0) o.staging_buffer_bytes = opts->staging_buffer_bytes;
    if (opts->staging_buffers != 0) o.staging_buffers = opts->staging_buffers;
  }
  if (opts->version >= 7 && opts->storage) o.storage = opts->storage->storage.get();
  return o;
}

Result<SaveOptions> ToSaveOptions(const dckpt_save_options* opts) {
  SaveOptions o;
  if (opts == nullptr) return o;
  DCKPT_RETURN_IF_ERROR(CheckVersion(opts->version, DCKPT_SAVE_OPTIONS_VERSION, "dckpt_save_options"));
  o.io_threads = opts->io_threads;
  o.overwrite = opts->overwrite != 0;
  o.sync = opts->sync != 0;
  if (opts->checksum_block_size) o.checksum_block_size = opts->checksum_block_size;
  o.timeout = Timeout(opts->timeout_ms);
  if (opts->version >= 2) o.progress = ProgressOf(opts->progress, opts->progress_user_data);
  if (opts->version >= 3) {
    if (opts->staging_buffer_bytes) o.staging_buffer_bytes = opts->staging_buffer_bytes;
    if (opts->staging_buffers) o.staging_buffers = opts->staging_buffers;
  }
  if (opts->version >= 4) o.max_async_staging_bytes = opts->max_async_staging_bytes;
  if (opts->version >= 5) o.device_snapshot = opts->device_snapshot != 0;
  if (opts->version >= 6 && opts->storage) o.storage = opts->storage->storage.get();
  if (opts->version >= 7) {
    if (opts->base) o.base = opts->base;
    o.full_every = opts->full_every;
  }
  if (opts->version >= 8) {
    o.compression = static_cast<Codec>(opts->compression);
    if (opts->compression < 0 || opts->compression > 255) {
      return InvalidArgument("dckpt_save_options.compression " + std::to_string(opts->compression) + " is unknown");
    }
    o.compression_level = opts->compression_level;
  }
  return o;
}

std::shared_ptr<Storage> StorageRef(const dckpt_save_options* opts) {
  return opts && opts->version >= 6 && opts->storage ? opts->storage->storage : nullptr;
}

std::shared_ptr<Storage> StorageRef(const dckpt_read_options* opts) {
  return opts && opts->version >= 7 && opts->storage ? opts->storage->storage : nullptr;
}

void FillSaveInfo(dckpt_save_info* info, const SaveSummary& r) {
  info->num_files = r.num_files;
  info->num_entries = r.num_entries;
  info->bytes_written = r.bytes_written;
  info->total_bytes = r.total_bytes;
  info->metadata_bytes = r.metadata_bytes;
  info->seconds = r.seconds;
  if (info->version >= 2) info->bytes_reused = r.bytes_reused;
}

Communicator* CommOf(dckpt_comm* comm) { return comm ? CommunicatorOf(comm) : nullptr; }

}  // namespace capi
}  // namespace distckpt

using distckpt::Box;
using distckpt::DType;
using distckpt::OkStatus;
using distckpt::Status;
using distckpt::capi::NotNull;
using distckpt::capi::Report;
using distckpt::capi::ReportException;

namespace {

// Where a buffer lives, from dckpt_piece_options (NULL: host memory).
distckpt::Result<distckpt::MemoryLocation> MemoryOf(const dckpt_piece_options* opts) {
  if (opts == nullptr) return distckpt::MemoryLocation{};
  DCKPT_RETURN_IF_ERROR(
      distckpt::capi::CheckVersion(opts->version, DCKPT_PIECE_OPTIONS_VERSION, "dckpt_piece_options"));
  // DCKPT_STREAM_READY: complete data, which waits for no stream.
  if (opts->stream == DCKPT_STREAM_READY) {
    return distckpt::MemoryLocation{static_cast<distckpt::MemoryKind>(opts->memory), opts->device, nullptr, true};
  }
  return distckpt::MemoryLocation{static_cast<distckpt::MemoryKind>(opts->memory), opts->device, opts->stream};
}

// A CUDA buffer must be memory of its device, `bytes` long inside one allocation (asking needs the driver, which this
// loads); DCKPT_DEVICE_OF_POINTER is replaced by the device the driver names. The engine checks the kind and the
// ordinal itself: the driver is asked only about a well-formed CUDA location.
Status CheckBuffer(distckpt::MemoryLocation* memory, const void* data, uint64_t bytes) {
  if (memory->kind != distckpt::MemoryKind::kCuda || memory->device < distckpt::kDeviceOfPointer) return OkStatus();
  return distckpt::ResolveDeviceBuffer(memory, data, bytes);
}

// dckpt_state_add_piece, its const twin and dckpt_state_add_piece_ex: the same checks, then the State call for the
// buffer's kind (a device buffer is first checked to be memory of its device, which loads the driver).
int AddPieceImpl(dckpt_state* state, const char* name, const uint64_t* offsets, const uint64_t* lengths,
                 const void* data, bool read_only, const distckpt::MemoryLocation& memory) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    distckpt::TensorEntry* t = state->state.FindTensor(name);
    if (t == nullptr) return Report(distckpt::InvalidArgument("tensor '" + std::string(name) + "' was not declared"));
    size_t ndim = t->shape.size();
    if (ndim > 0 && (offsets == nullptr || lengths == nullptr)) {
      return Report(distckpt::InvalidArgument("tensor '" + std::string(name) + "': offsets/lengths are NULL"));
    }
    std::vector<uint64_t> off(offsets, offsets + ndim), len(lengths, lengths + ndim);
    if (memory.is_host()) {
      return Report(read_only ? state->state.AddConstPiece(name, off, len, data)
                              : state->state.AddPiece(name, off, len, const_cast<void*>(data)));
    }
    distckpt::MemoryLocation where = memory;
    uint64_t bytes = distckpt::DTypeSize(t->dtype);
    for (size_t i = 0; i < ndim; ++i) bytes *= len[i];  // a bad box is refused by AddPieceIn below, naming it
    if (Status st = CheckBuffer(&where, data, bytes); !st.ok()) {
      return Report(st.WithContext("tensor '" + std::string(name) + "' (" + memory.ToString() + ")"));
    }
    return Report(state->state.AddPieceIn(name, off, len, const_cast<void*>(data), where));
  })
}

}  // namespace

extern "C" {

unsigned dckpt_version(void) { return DCKPT_VERSION_MAJOR * 10000 + DCKPT_VERSION_MINOR * 100 + DCKPT_VERSION_PATCH; }
const char* dckpt_version_string(void) { return distckpt::kVersionString; }
unsigned dckpt_abi_version(void) { return DCKPT_ABI_VERSION; }

const char* dckpt_error_last(void) { return distckpt::capi::t_error_message.c_str(); }
int dckpt_error_last_code(void) { return distckpt::capi::t_error_code; }
void dckpt_error_clear(void) {
  distckpt::capi::t_error_code = DCKPT_OK;
  distckpt::capi::t_error_message.clear();
}
const char* dckpt_status_name(int status) {
  if (status > 0 || status < DCKPT_EINTERNAL) return "unknown";
  return distckpt::StatusCodeName(static_cast<distckpt::StatusCode>(status));
}

size_t dckpt_dtype_size(int dtype) {
  return distckpt::IsValidDType(static_cast<uint32_t>(dtype)) ? distckpt::DTypeSize(static_cast<DType>(dtype)) : 0;
}
const char* dckpt_dtype_name(int dtype) {
  return distckpt::IsValidDType(static_cast<uint32_t>(dtype)) ? distckpt::DTypeName(static_cast<DType>(dtype))
                                                              : nullptr;
}
int dckpt_dtype_from_name(int* out, const char* name) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    DType d = distckpt::DTypeFromName(name);
    if (d == DType::kInvalid)
      return Report(distckpt::InvalidArgument(std::string("unknown dtype name '") + name + "'"));
    *out = static_cast<int>(d);
    return DCKPT_OK;
  })
}

/* ---- state ---- */

int dckpt_state_new(dckpt_state** out) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = new dckpt_state();
    return DCKPT_OK;
  })
}

void dckpt_state_free(dckpt_state* state) { delete state; }

int dckpt_state_add_tensor(dckpt_state* state, const char* name, int dtype, size_t ndim, const uint64_t* shape) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    if (ndim > 0 && shape == nullptr) return Report(distckpt::InvalidArgument("shape is NULL but ndim > 0"));
    if (ndim > DCKPT_MAX_DIMS) {
      return Report(distckpt::InvalidArgument("tensor '" + std::string(name) + "' has " + std::to_string(ndim) +
                                              " dimensions; at most 8 are supported"));
    }
    if (!distckpt::IsValidDType(static_cast<uint32_t>(dtype))) {
      return Report(
          distckpt::InvalidArgument("tensor '" + std::string(name) + "': unknown dtype " + std::to_string(dtype)));
    }
    std::vector<uint64_t> s(shape, shape + ndim);
    return Report(state->state.AddTensor(name, static_cast<DType>(dtype), s));
  })
}

int dckpt_state_add_piece(dckpt_state* state, const char* name, const uint64_t* offsets, const uint64_t* lengths,
                          void* data) {
  return AddPieceImpl(state, name, offsets, lengths, data, /*read_only=*/false, distckpt::MemoryLocation{});
}

int dckpt_state_add_piece_const(dckpt_state* state, const char* name, const uint64_t* offsets, const uint64_t* lengths,
                                const void* data) {
  return AddPieceImpl(state, name, offsets, lengths, data, /*read_only=*/true, distckpt::MemoryLocation{});
}

int dckpt_piece_options_init(dckpt_piece_options* opts, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_piece_options>(opts, "opts", DCKPT_PIECE_OPTIONS_INIT, version,
                                                            DCKPT_PIECE_OPTIONS_VERSION, "dckpt_piece_options");
}

int dckpt_state_add_piece_ex(dckpt_state* state, const char* name, const uint64_t* offsets, const uint64_t* lengths,
                             void* data, const dckpt_piece_options* opts) {
  auto memory = MemoryOf(opts);
  if (!memory.ok()) return Report(memory.status());
  return AddPieceImpl(state, name, offsets, lengths, data, /*read_only=*/false, *memory);
}

int dckpt_state_add_bytes_const(dckpt_state* state, const char* name, const void* data, uint64_t size) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    return Report(state->state.AddConstBytes(name, data, size));
  })
}

int dckpt_state_add_bytes(dckpt_state* state, const char* name, void* data, uint64_t size) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    return Report(state->state.AddBytes(name, data, size));
  })
}

int dckpt_state_bytes_size(uint64_t* out, const dckpt_state* state, const char* name) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    auto* b = const_cast<distckpt::State&>(state->state).FindBytes(name);
    if (b == nullptr) return Report(distckpt::NotFound("state has no bytes entry '" + std::string(name) + "'"));
    *out = b->loaded_size;
    return DCKPT_OK;
  })
}

int dckpt_state_set_user(dckpt_state* state, const char* key, const char* value) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(NotNull(key, "key"));
    DCKPT_RETURN_IF_FAILED(NotNull(value, "value"));
    state->state.SetUserMetadata(key, value);
    return DCKPT_OK;
  })
}

int dckpt_state_set_structure(dckpt_state* state, const char* data, size_t size) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    if (size > 0 && data == nullptr) return Report(distckpt::InvalidArgument("structure data is NULL"));
    state->state.SetStructure(std::string(data ? data : "", size));
    return DCKPT_OK;
  })
}

/* ---- save ---- */

int dckpt_save_options_init(dckpt_save_options* opts, unsigned version) {
  const size_t size = version >= 8   ? sizeof(dckpt_save_options)
                      : version == 7 ? offsetof(dckpt_save_options, compression)
                      : version == 6 ? offsetof(dckpt_save_options, base)
                      : version == 5 ? offsetof(dckpt_save_options, storage)
                      : version == 4 ? offsetof(dckpt_save_options, device_snapshot)
                      : version == 3 ? offsetof(dckpt_save_options, max_async_staging_bytes)
                      : version == 2 ? offsetof(dckpt_save_options, staging_buffer_bytes)
                                     : offsetof(dckpt_save_options, progress);
  return distckpt::capi::InitVersioned<dckpt_save_options>(opts, "opts", DCKPT_SAVE_OPTIONS_INIT, version,
                                                           DCKPT_SAVE_OPTIONS_VERSION, "dckpt_save_options", size);
}

int dckpt_save(dckpt_save_info* info, const char* path, const dckpt_state* state, dckpt_comm* comm,
               const dckpt_save_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    if (info) {
      DCKPT_RETURN_IF_FAILED(distckpt::capi::CheckVersion(info->version, DCKPT_SAVE_INFO_VERSION, "dckpt_save_info"));
    }
    auto o = distckpt::capi::ToSaveOptions(opts);
    if (!o.ok()) return Report(o.status());
    auto held = distckpt::capi::StorageForCall(distckpt::capi::StorageRef(opts), path);
    if (!held.ok()) return Report(held.status());
    if (*held) o->storage = held->get();
    auto r = distckpt::Save(path, state->state, distckpt::capi::CommOf(comm), *o);
    if (!r.ok()) return Report(r.status());
    if (info) distckpt::capi::FillSaveInfo(info, *r);
    return DCKPT_OK;
  })
}

int dckpt_save_async(dckpt_save_future** out, const char* path, const dckpt_state* state, dckpt_comm* comm,
                     const dckpt_save_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    auto o = distckpt::capi::ToSaveOptions(opts);
    if (!o.ok()) return Report(o.status());
    auto held = distckpt::capi::StorageForCall(distckpt::capi::StorageRef(opts), path);
    if (!held.ok()) return Report(held.status());
    if (*held) o->storage = held->get();
    auto f = distckpt::SaveAsync(path, state->state, distckpt::capi::CommOf(comm), *o);
    if (!f.ok()) return Report(f.status());
    *out = new dckpt_save_future{*held, std::move(f).value()};
    return DCKPT_OK;
  })
}

int dckpt_save_future_wait(dckpt_save_info* info, dckpt_save_future* future, uint64_t timeout_ms) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(future, "future"));
    if (info)
      DCKPT_RETURN_IF_FAILED(distckpt::capi::CheckVersion(info->version, DCKPT_SAVE_INFO_VERSION, "dckpt_save_info"));
    // Cap "forever" so that the chrono arithmetic inside cannot overflow (about 292 years).
    const uint64_t ms = std::min<uint64_t>(timeout_ms, uint64_t{1} << 53);
    auto r = future->future->Wait(std::chrono::milliseconds(ms));
    if (!r.ok()) return Report(r.status());
    if (info) distckpt::capi::FillSaveInfo(info, *r);
    return DCKPT_OK;
  })
}

int dckpt_save_future_test(int* done, const dckpt_save_future* future) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(done, "done"));
    DCKPT_RETURN_IF_FAILED(NotNull(future, "future"));
    *done = future->future->done() ? 1 : 0;
    return DCKPT_OK;
  })
}

int dckpt_save_future_staging(double* seconds, uint64_t* bytes, const dckpt_save_future* future) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(future, "future"));
    if (seconds) *seconds = future->future->staging_seconds();
    if (bytes) *bytes = future->future->staged_bytes();
    return DCKPT_OK;
  })
}

int dckpt_save_future_snapshot(uint64_t* snapshot_bytes, uint64_t* fallback_bytes, const dckpt_save_future* future) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(future, "future"));
    if (snapshot_bytes) *snapshot_bytes = future->future->snapshot_bytes();
    if (fallback_bytes) *fallback_bytes = future->future->snapshot_fallback_bytes();
    return DCKPT_OK;
  })
}

void dckpt_save_future_free(dckpt_save_future* future) {
  try {
    delete future;
  } catch (...) {
  }
}

/* ---- load / read ---- */

int dckpt_read_options_init(dckpt_read_options* opts, unsigned version) {
  const size_t size = version >= 7   ? sizeof(dckpt_read_options)
                      : version == 6 ? offsetof(dckpt_read_options, storage)
                      : version == 5 ? offsetof(dckpt_read_options, staging_buffer_bytes)
                      : version == 4 ? offsetof(dckpt_read_options, fanout)
                      : version == 3 ? offsetof(dckpt_read_options, pin_files)
                      : version == 2 ? offsetof(dckpt_read_options, map_files)
                                     : offsetof(dckpt_read_options, progress);
  return distckpt::capi::InitVersioned<dckpt_read_options>(opts, "opts", DCKPT_READ_OPTIONS_INIT, version,
                                                           DCKPT_READ_OPTIONS_VERSION, "dckpt_read_options", size);
}

static void FillIoStats(dckpt_io_stats* out, const distckpt::IoStats& s, double seconds) {
  out->bytes_read = s.bytes_read;
  out->read_calls = s.read_calls;
  out->bytes_verified = s.bytes_verified;
  out->bytes_delivered = s.bytes_delivered;
  out->seconds = seconds;
  if (out->version >= 2) out->bytes_mapped = s.bytes_mapped;
  if (out->version >= 3) {
    out->bytes_received_from_peers = s.bytes_received_from_peers;
    out->bytes_sent_to_peers = s.bytes_sent_to_peers;
  }
  if (out->version >= 4) out->bytes_read_direct = s.bytes_read_direct;
}

int dckpt_load(dckpt_io_stats* stats, const char* path, dckpt_state* state, dckpt_comm* comm,
               const dckpt_read_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    if (stats) {
      DCKPT_RETURN_IF_FAILED(distckpt::capi::CheckVersion(stats->version, DCKPT_IO_STATS_VERSION, "dckpt_io_stats"));
    }
    auto o = distckpt::capi::ToReadOptions(opts);
    if (!o.ok()) return Report(o.status());
    auto held = distckpt::capi::StorageForCall(distckpt::capi::StorageRef(opts), path);
    if (!held.ok()) return Report(held.status());
    if (*held) o->storage = held->get();
    auto r = distckpt::Load(path, state->state, distckpt::capi::CommOf(comm), *o);
    if (!r.ok()) return Report(r.status());
    if (stats) FillIoStats(stats, r->io, r->seconds);
    return DCKPT_OK;
  })
}

int dckpt_reader_open(dckpt_reader** out, const char* path, dckpt_comm* comm, const dckpt_read_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    auto o = distckpt::capi::ToReadOptions(opts);
    if (!o.ok()) return Report(o.status());
    auto held = distckpt::capi::StorageForCall(distckpt::capi::StorageRef(opts), path);
    if (!held.ok()) return Report(held.status());
    if (*held) o->storage = held->get();
    const bool pin = opts == nullptr || opts->version < 4 || opts->pin_files != 0;
    auto r = distckpt::Reader::Open(path, distckpt::capi::CommOf(comm), *o,
                                    pin ? distckpt::FilePinning::kAllAtOpen : distckpt::FilePinning::kOnFirstUse);
    if (!r.ok()) return Report(r.status());
    *out = new dckpt_reader{*held, std::move(r).value()};
    return DCKPT_OK;
  })
}

int dckpt_reader_load(dckpt_io_stats* stats, dckpt_reader* reader, dckpt_state* state, dckpt_comm* comm,
                      dckpt_progress_fn progress, void* progress_user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    if (stats) {
      DCKPT_RETURN_IF_FAILED(distckpt::capi::CheckVersion(stats->version, DCKPT_IO_STATS_VERSION, "dckpt_io_stats"));
    }
    auto r = distckpt::Load(reader->reader.get(), state->state, distckpt::capi::CommOf(comm),
                            distckpt::capi::ProgressOf(progress, progress_user_data));
    if (!r.ok()) return Report(r.status());
    if (stats) FillIoStats(stats, r->io, r->seconds);
    return DCKPT_OK;
  })
}

void dckpt_reader_free(dckpt_reader* reader) { delete reader; }

#define DCKPT_CHECK_OUT_STRUCT(ptr, VERSION, what)                                                               \
  do {                                                                                                           \
    if (Status st_ = NotNull(ptr, what); !st_.ok()) return Report(st_);                                          \
    if (Status st_ = distckpt::capi::CheckVersion((ptr)->version, VERSION, what); !st_.ok()) return Report(st_); \
  } while (0)

// A borrowed C string for a string of the metadata. An optional string the file leaves out (writer, a user value, the
// structure) has no storage: it is handed out as "", never as NULL, which callers would pass on to strlen or Python.
static const char* BorrowedCString(std::string_view s) { return s.data() != nullptr ? s.data() : ""; }

// Entry `entry` of the metadata, after checking that it has a chunk `chunk`.
static distckpt::Result<distckpt::EntryView> EntryWithChunk(const distckpt::MetadataView& m, size_t entry,
                                                            size_t chunk) {
  if (entry >= m.num_entries()) return distckpt::InvalidArgument("entry index out of range");
  distckpt::EntryView e = m.entry(entry);
  if (chunk >= e.num_chunks) {
    return distckpt::InvalidArgument("entry '" + std::string(e.name) + "' has " + std::to_string(e.num_chunks) +
                                     " chunks; index " + std::to_string(chunk) + " is out of range");
  }
  return e;
}

int dckpt_reader_info(dckpt_checkpoint_info* out, const dckpt_reader* reader) {
  DCKPT_GUARD({
    DCKPT_CHECK_OUT_STRUCT(out, DCKPT_CHECKPOINT_INFO_VERSION, "dckpt_checkpoint_info");
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    const distckpt::MetadataView& m = reader->reader->metadata();
    out->format_major = m.format_major();
    out->format_minor = m.format_minor();
    out->writer = BorrowedCString(m.writer());
    out->num_entries = m.num_entries();
    out->num_files = m.num_files();
    uint64_t total = 0;
    for (size_t i = 0; i < m.num_entries(); ++i) total += m.entry(i).nbytes();
    out->total_bytes = total;
    out->metadata_bytes = m.buffer_size();
    out->checksum_block_size = m.checksummed() ? m.checksum_block_size() : 0;  // no checksums, no blocks
    if (out->version >= 2) {
      out->source = BorrowedCString(m.source());
      out->checksummed = m.checksummed() ? 1 : 0;
    }
    if (out->version >= 3) out->source_version = BorrowedCString(distckpt::ForeignFormatVersion(m));
    if (out->version >= 4) {
      out->num_bases = m.num_bases();
      out->chain_length = m.chain_length();
      uint64_t in_bases = 0;
      for (size_t i = 0; i < m.num_entries(); ++i) {
        const distckpt::EntryView e = m.entry(i);
        for (size_t c = 0; c < e.num_chunks; ++c) {
          const distckpt::ChunkLocation loc = e.chunk(c);
          if (m.file_base(loc.file) != 0) in_bases += loc.length;
        }
      }
      out->bytes_in_bases = in_bases;
    }
    if (out->version >= 5) {
      uint64_t stored = 0;
      size_t compressed = 0;
      for (size_t i = 0; i < m.num_entries(); ++i) {
        const distckpt::EntryView e = m.entry(i);
        for (size_t c = 0; c < e.num_chunks; ++c) {
          stored += e.coding(c).stored_length;
          compressed += e.compressed(c) ? 1 : 0;
        }
      }
      out->stored_bytes = stored;
      out->compressed_chunks = compressed;
    }
    return DCKPT_OK;
  })
}

int dckpt_reader_base(const char** name, const dckpt_reader* reader, size_t index) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    const distckpt::MetadataView& m = reader->reader->metadata();
    if (index >= m.num_bases()) {
      return Report(distckpt::InvalidArgument("base index " + std::to_string(index) + " out of range (checkpoint '" +
                                              reader->reader->path() + "' has " + std::to_string(m.num_bases()) +
                                              " bases)"));
    }
    *name = BorrowedCString(m.base_name(index));
    return DCKPT_OK;
  })
}

int dckpt_reader_entry(dckpt_entry_info* out, const dckpt_reader* reader, size_t index) {
  DCKPT_GUARD({
    DCKPT_CHECK_OUT_STRUCT(out, DCKPT_ENTRY_INFO_VERSION, "dckpt_entry_info");
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    const distckpt::MetadataView& m = reader->reader->metadata();
    if (index >= m.num_entries()) {
      return Report(distckpt::InvalidArgument("entry index " + std::to_string(index) + " out of range (" +
                                              std::to_string(m.num_entries()) + " entries)"));
    }
    distckpt::EntryView e = m.entry(index);
    out->kind = static_cast<int>(e.kind);
    out->dtype = static_cast<int>(e.dtype);
    out->name = e.name.data();
    out->ndim = e.shape.size();
    out->shape = e.shape.data();
    out->nbytes = e.nbytes();
    out->num_chunks = e.num_chunks;
    return DCKPT_OK;
  })
}

int dckpt_reader_find(size_t* index, const dckpt_reader* reader, const char* name) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(index, "index"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    auto i = reader->reader->metadata().Find(name);
    if (!i) {
      return Report(distckpt::NotFound("checkpoint '" + reader->reader->path() + "' has no entry '" + name + "'"));
    }
    *index = *i;
    return DCKPT_OK;
  })
}

int dckpt_reader_chunk(dckpt_chunk_info* out, const dckpt_reader* reader, size_t entry, size_t chunk) {
  DCKPT_GUARD({
    DCKPT_CHECK_OUT_STRUCT(out, DCKPT_CHUNK_INFO_VERSION, "dckpt_chunk_info");
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    const distckpt::MetadataView& m = reader->reader->metadata();
    auto found = EntryWithChunk(m, entry, chunk);
    if (!found.ok()) return Report(found.status());
    const distckpt::EntryView e = *found;
    distckpt::ChunkLocation loc = e.chunk(chunk);
    out->ndim = e.ndim();
    out->offsets = e.chunk_offsets + chunk * e.ndim();
    out->lengths = e.chunk_lengths + chunk * e.ndim();
    out->file = m.file_name(loc.file).data();
    out->file_offset = loc.offset;
    out->length = loc.length;
    out->checksum = loc.checksum;
    if (out->version >= 2) {
      const uint32_t base = m.file_base(loc.file);
      out->base = base == 0 ? "" : BorrowedCString(m.base_name(base - 1));
    }
    if (out->version >= 3) {
      out->codec = static_cast<int>(e.coding(chunk).codec);
      out->stored_length = e.coding(chunk).stored_length;
    }
    return DCKPT_OK;
  })
}

int dckpt_reader_map_chunk(const void** data, uint64_t* size, dckpt_reader* reader, size_t entry, size_t chunk) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(data, "data"));
    DCKPT_RETURN_IF_FAILED(NotNull(size, "size"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    auto found = EntryWithChunk(reader->reader->metadata(), entry, chunk);
    if (!found.ok()) return Report(found.status());
    auto bytes = reader->reader->MapChunk(entry, static_cast<uint32_t>(chunk));
    if (!bytes.ok()) return Report(bytes.status());
    *data = bytes->data();
    *size = bytes->size();
    return DCKPT_OK;
  })
}

int dckpt_reader_read(dckpt_reader* reader, const char* name, size_t ndim, const uint64_t* offsets,
                      const uint64_t* lengths, void* dst, uint64_t dst_size) {
  return dckpt_reader_read_ex(reader, name, ndim, offsets, lengths, dst, dst_size, nullptr);
}

int dckpt_reader_read_ex(dckpt_reader* reader, const char* name, size_t ndim, const uint64_t* offsets,
                         const uint64_t* lengths, void* dst, uint64_t dst_size, const dckpt_piece_options* dst_opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    if (ndim > DCKPT_MAX_DIMS) return Report(distckpt::InvalidArgument("ndim > 8"));
    if (ndim > 0 && (offsets == nullptr || lengths == nullptr)) {
      return Report(distckpt::InvalidArgument("offsets/lengths are NULL"));
    }
    if (dst == nullptr && dst_size > 0) return Report(distckpt::InvalidArgument("dst is NULL"));
    auto memory = MemoryOf(dst_opts);
    if (!memory.ok()) return Report(memory.status());
    const std::string into = memory->ToString();
    if (Status st = CheckBuffer(&*memory, dst, dst_size); !st.ok()) {
      return Report(st.WithContext("reading '" + std::string(name) + "' into " + into));
    }
    auto box = Box::Make(distckpt::Span<const uint64_t>(offsets, ndim), distckpt::Span<const uint64_t>(lengths, ndim));
    if (!box.ok()) return Report(box.status());
    return Report(reader->reader->ReadRegion(name, *box, dst, dst_size, *memory));
  })
}

int dckpt_reader_read_bytes(uint64_t* size, dckpt_reader* reader, const char* name, void* dst, uint64_t capacity) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    if (dst == nullptr && capacity > 0) return Report(distckpt::InvalidArgument("dst is NULL"));
    // Report the size even when the buffer is too small, so that a NULL/0 call is a size query.
    const distckpt::MetadataView& m = reader->reader->metadata();
    auto idx = m.Find(name);
    if (size && idx && m.entry(*idx).kind == distckpt::EntryKind::kBytes) *size = m.entry(*idx).nbytes();
    auto r = reader->reader->ReadBytes(name, dst, capacity);
    if (!r.ok()) return Report(r.status());
    if (size) *size = *r;
    return DCKPT_OK;
  })
}

int dckpt_reader_num_user(size_t* out, const dckpt_reader* reader) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    *out = reader->reader->metadata().num_user();
    return DCKPT_OK;
  })
}

int dckpt_reader_user(const char** key, const char** value, const dckpt_reader* reader, size_t index) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(key, "key"));
    DCKPT_RETURN_IF_FAILED(NotNull(value, "value"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    const distckpt::MetadataView& m = reader->reader->metadata();
    if (index >= m.num_user()) return Report(distckpt::InvalidArgument("user metadata index out of range"));
    auto kv = m.user(index);
    *key = BorrowedCString(kv.first);
    *value = BorrowedCString(kv.second);
    return DCKPT_OK;
  })
}

int dckpt_reader_user_get(const char** value, const dckpt_reader* reader, const char* key) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(value, "value"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    DCKPT_RETURN_IF_FAILED(NotNull(key, "key"));
    auto v = reader->reader->metadata().FindUser(key);
    if (!v)
      return Report(distckpt::NotFound("checkpoint '" + reader->reader->path() + "' has no user key '" + key + "'"));
    *value = BorrowedCString(*v);
    return DCKPT_OK;
  })
}

int dckpt_reader_structure(const char** data, size_t* size, const dckpt_reader* reader) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(data, "data"));
    DCKPT_RETURN_IF_FAILED(NotNull(size, "size"));
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    std::string_view s = reader->reader->metadata().structure();
    *data = BorrowedCString(s);
    *size = s.size();
    return DCKPT_OK;
  })
}

int dckpt_reader_verify(dckpt_reader* reader, dckpt_progress_fn progress, void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    return Report(reader->reader->VerifyAll(distckpt::capi::ProgressOf(progress, user_data)));
  })
}

int dckpt_reader_verify_chunk(dckpt_reader* reader, size_t entry, size_t chunk) {
  return dckpt_reader_verify_chunk_progress(reader, entry, chunk, nullptr, nullptr);
}

int dckpt_reader_verify_chunk_progress(dckpt_reader* reader, size_t entry, size_t chunk, dckpt_progress_fn progress,
                                       void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    if (chunk > UINT32_MAX) return Report(distckpt::InvalidArgument("chunk index out of range"));
    return Report(reader->reader->VerifyChunk(entry, static_cast<uint32_t>(chunk),
                                              distckpt::capi::ProgressOf(progress, user_data)));
  })
}

int dckpt_map_all_options_init(dckpt_map_all_options* opts, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_map_all_options>(opts, "opts", DCKPT_MAP_ALL_OPTIONS_INIT, version,
                                                              DCKPT_MAP_ALL_OPTIONS_VERSION, "dckpt_map_all_options",
                                                              sizeof(dckpt_map_all_options));
}

int dckpt_reader_map_all(dckpt_reader* reader, const dckpt_map_all_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    std::vector<size_t> entries;
    distckpt::ProgressFn fn;
    if (opts != nullptr) {
      DCKPT_RETURN_IF_FAILED(
          distckpt::capi::CheckVersion(opts->version, DCKPT_MAP_ALL_OPTIONS_VERSION, "dckpt_map_all_options"));
      if (opts->num_entries > 0) {
        DCKPT_RETURN_IF_FAILED(NotNull(opts->entries, "opts->entries"));
        entries.assign(opts->entries, opts->entries + opts->num_entries);
      }
      fn = distckpt::capi::ProgressOf(opts->progress, opts->progress_user_data);
    }
    return Report(reader->reader->MapAll(entries, fn));
  })
}

int dckpt_reader_io_stats(dckpt_io_stats* out, const dckpt_reader* reader) {
  DCKPT_GUARD({
    DCKPT_CHECK_OUT_STRUCT(out, DCKPT_IO_STATS_VERSION, "dckpt_io_stats");
    DCKPT_RETURN_IF_FAILED(NotNull(reader, "reader"));
    FillIoStats(out, reader->reader->io_stats(), 0.0);
    return DCKPT_OK;
  })
}

}  // extern "C"
