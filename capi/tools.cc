// The tools part of the C ABI: offline operations on committed checkpoints (safetensors export).
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>

#include "capi/capi_internal.h"
#include "capi/include/distckpt/distckpt.h"
#include "core/tools/flatten.h"
#include "core/tools/safetensors_export.h"

using distckpt::capi::CheckVersion;
using distckpt::capi::NotNull;
using distckpt::capi::Report;

extern "C" {

int dckpt_export_options_init(dckpt_export_options* opts, unsigned version) {
  const size_t size = version >= 3   ? sizeof(dckpt_export_options)
                      : version == 2 ? offsetof(dckpt_export_options, rename_rules)
                                     : offsetof(dckpt_export_options, storage);
  return distckpt::capi::InitVersioned<dckpt_export_options>(
      opts, "opts", DCKPT_EXPORT_OPTIONS_INIT, version, DCKPT_EXPORT_OPTIONS_VERSION, "dckpt_export_options", size);
}

int dckpt_export_safetensors(const char* ckpt_path, const char* out_dir, const dckpt_export_options* opts) {
  return dckpt_export_safetensors_collective(ckpt_path, out_dir, nullptr, opts);
}

int dckpt_export_safetensors_collective(const char* ckpt_path, const char* out_dir, dckpt_comm* comm,
                                        const dckpt_export_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(ckpt_path, "ckpt_path"));
    DCKPT_RETURN_IF_FAILED(NotNull(out_dir, "out_dir"));
    distckpt::SafetensorsExportOptions o;
    if (opts) {
      DCKPT_RETURN_IF_FAILED(CheckVersion(opts->version, DCKPT_EXPORT_OPTIONS_VERSION, "dckpt_export_options"));
      if (opts->max_shard_bytes) o.max_shard_bytes = opts->max_shard_bytes;
      if (opts->prefix) o.prefix = opts->prefix;
      o.verify = opts->verify != 0;
      if (opts->progress) {
        dckpt_progress_fn fn = opts->progress;
        void* user = opts->progress_user_data;
        o.progress = [fn, user](uint64_t done, uint64_t total) { return fn(done, total, user); };
      }
      if (opts->version >= 3) {
        if (opts->num_rename_rules > 0) DCKPT_RETURN_IF_FAILED(NotNull(opts->rename_rules, "opts->rename_rules"));
        for (size_t i = 0; i < opts->num_rename_rules; ++i) {
          const dckpt_rename_rule& r = opts->rename_rules[i];
          if (r.pattern == nullptr) {
            return Report(distckpt::InvalidArgument("opts->rename_rules[" + std::to_string(i) + "].pattern is NULL"));
          }
          o.rename_rules.push_back({r.pattern, r.replacement ? r.replacement : ""});
        }
        if (opts->buffer_bytes) o.buffer_bytes = opts->buffer_bytes;
        o.io_threads = opts->io_threads;
        if (opts->timeout_ms) o.timeout = std::chrono::milliseconds(opts->timeout_ms);
      }
    }
    // NULL storages: as the paths say (a URL's storage, else the POSIX file system), each on its own.
    auto in = distckpt::capi::StorageOrUrl(opts && opts->version >= 2 ? opts->storage : nullptr, ckpt_path);
    if (!in.ok()) return Report(in.status());
    auto out = distckpt::capi::StorageOrUrl(opts && opts->version >= 2 ? opts->out_storage : nullptr, out_dir);
    if (!out.ok()) return Report(out.status());
    o.storage = in->get();
    o.out_storage = out->get();
    o.comm = comm ? distckpt::capi::CommunicatorOf(comm) : nullptr;
    auto r = distckpt::ExportSafetensors(ckpt_path, out_dir, o);
    if (!r.ok()) return Report(r.status());
    return DCKPT_OK;
  })
}

int dckpt_flatten(dckpt_flatten_info* info, const char* src, const char* dst, int overwrite, dckpt_storage* storage) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(src, "src"));
    DCKPT_RETURN_IF_FAILED(NotNull(dst, "dst"));
    if (info) DCKPT_RETURN_IF_FAILED(CheckVersion(info->version, DCKPT_FLATTEN_INFO_VERSION, "dckpt_flatten_info"));
    auto held = distckpt::capi::StorageOrUrl(storage, src);
    if (!held.ok()) return Report(held.status());
    auto r = distckpt::FlattenCheckpoint(src, dst, overwrite != 0, held->get());
    if (!r.ok()) return Report(r.status());
    if (info) {
      info->bytes_copied = r->bytes_copied;
      info->bytes_from_bases = r->bytes_from_bases;
      info->num_files = r->num_files;
    }
    return DCKPT_OK;
  })
}

}  // extern "C"
