// The C ABI of the checkpoint manager (core/manager).
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>

#include "capi/capi_internal.h"
#include "core/manager/manager.h"
#include "core/manager/tier_report.h"

using distckpt::capi::NotNull;
using distckpt::capi::Report;

// The storage is declared first so that it outlives the manager, whose destructor waits for background persists.
struct dckpt_manager {
  std::shared_ptr<distckpt::Storage> storage;
  std::unique_ptr<distckpt::CheckpointManager> manager;
};

namespace {

// The bytes of dckpt_manager_options that a caller built against `version` has.
size_t ManagerOptionsSize(unsigned version) {
  return version >= 3   ? sizeof(dckpt_manager_options)
         : version == 2 ? offsetof(dckpt_manager_options, persist_compression)
                        : offsetof(dckpt_manager_options, threads);
}

}  // namespace

int dckpt_manager_options_init(dckpt_manager_options* opts, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_manager_options>(opts, "opts", DCKPT_MANAGER_OPTIONS_INIT, version,
                                                              DCKPT_MANAGER_OPTIONS_VERSION, "dckpt_manager_options",
                                                              ManagerOptionsSize(version));
}

int dckpt_restore_options_init(dckpt_restore_options* opts, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_restore_options>(opts, "opts", DCKPT_RESTORE_OPTIONS_INIT, version,
                                                              DCKPT_RESTORE_OPTIONS_VERSION, "dckpt_restore_options");
}

int dckpt_manager_new(dckpt_manager** out, dckpt_comm* comm, const dckpt_manager_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    dckpt_manager_options o = DCKPT_MANAGER_OPTIONS_INIT;
    if (opts) {
      DCKPT_RETURN_IF_FAILED(
          distckpt::capi::CheckVersion(opts->version, DCKPT_MANAGER_OPTIONS_VERSION, "dckpt_manager_options"));
      std::memcpy(&o, opts, ManagerOptionsSize(opts->version));  // an older caller's struct is shorter
    }
    distckpt::ManagerOptions m;
    const std::string job = o.job && *o.job ? o.job : "default";
    if (job.find('/') != std::string::npos) {
      return Report(distckpt::InvalidArgument("dckpt_manager_options.job must not contain '/': '" + job + "'"));
    }
    m.local_dir = o.local_dir && *o.local_dir ? o.local_dir : "/dev/shm/distckpt-" + job;
    if (o.node_id && *o.node_id) {
      m.node_id = o.node_id;
    } else {
      char host[HOST_NAME_MAX + 1] = {};
      if (gethostname(host, sizeof host - 1) != 0 || !*host) {
        return Report(distckpt::ErrnoError(errno, "dckpt_manager_new: gethostname (pass node_id)"));
      }
      m.node_id = host;
    }
    m.replicas =
        o.replicas == DCKPT_REPLICAS_AUTO ? distckpt::kAutoReplicas : static_cast<int>(o.replicas > 8 ? 9 : o.replicas);
    m.persist_every = o.persist_every;
    m.keep_local = o.keep_local ? static_cast<int>(std::min<unsigned>(o.keep_local, 1u << 20)) : 2;
    m.keep_persistent = static_cast<int>(std::min<unsigned>(o.keep_persistent, 1u << 20));
    m.local_budget_bytes = o.local_budget_bytes;
    m.timeout = distckpt::capi::Timeout(o.timeout_ms);
    m.device_snapshot = o.device_snapshot != 0;
    if (o.exchange_round_bytes) m.exchange_round_bytes = o.exchange_round_bytes;
    m.threads = o.threads;
    switch (o.background_priority) {
      case DCKPT_PRIORITY_DEFAULT:
        break;  // ManagerOptions' default
      case DCKPT_PRIORITY_NORMAL:
        m.background_priority = distckpt::ThreadPriority::kNormal;
        break;
      case DCKPT_PRIORITY_LOW:
        m.background_priority = distckpt::ThreadPriority::kLow;
        break;
      case DCKPT_PRIORITY_IDLE:
        m.background_priority = distckpt::ThreadPriority::kIdle;
        break;
      default:
        return Report(distckpt::InvalidArgument(
            "dckpt_manager_options.background_priority: " + std::to_string(o.background_priority) +
            " is no dckpt_priority (0 to 3)"));
    }
    if (o.persist_compression < 0 || o.persist_compression > 255) {
      return Report(distckpt::InvalidArgument("dckpt_manager_options.persist_compression " +
                                              std::to_string(o.persist_compression) + " is unknown"));
    }
    m.persist_compression = static_cast<distckpt::Codec>(o.persist_compression);
    m.persist_compression_level = o.persist_compression_level;
    m.persist_incremental = o.persist_incremental != 0;
    m.persist_full_every = o.persist_full_every;
    std::shared_ptr<distckpt::Storage> held;
    if (o.persistent_path && *o.persistent_path) {
      m.persistent_path = o.persistent_path;
      while (m.persistent_path.size() > 1 && m.persistent_path.back() == '/') m.persistent_path.pop_back();
      auto s = distckpt::capi::StorageOrUrl(o.persistent_storage, o.persistent_path);
      if (!s.ok()) return Report(s.status());
      held = s.value();
      m.persistent_storage = held;
    }
    auto r = distckpt::CheckpointManager::Create(comm ? distckpt::capi::CommunicatorOf(comm) : nullptr, m);
    if (!r.ok()) return Report(r.status());
    *out = new dckpt_manager{held, std::move(r).value()};
    return DCKPT_OK;
  })
}

void dckpt_manager_free(dckpt_manager* manager) {
  try {
    delete manager;
  } catch (...) {
  }
}

int dckpt_manager_save(dckpt_manager* manager, uint64_t step, const dckpt_state* state, int persist) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(manager, "manager"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    DCKPT_RETURN_IF_FAILED(manager->manager->Save(step, state->state, persist != 0));
    return DCKPT_OK;
  })
}

int dckpt_manager_wait(dckpt_manager* manager, uint64_t timeout_ms) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(manager, "manager"));
    const uint64_t ms = std::min<uint64_t>(timeout_ms, uint64_t{1} << 53);
    DCKPT_RETURN_IF_FAILED(manager->manager->Wait(std::chrono::milliseconds(ms)));
    return DCKPT_OK;
  })
}

int dckpt_manager_stats(dckpt_manager_counters* out, const dckpt_manager* manager) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(manager, "manager"));
    DCKPT_RETURN_IF_FAILED(
        distckpt::capi::CheckVersion(out->version, DCKPT_MANAGER_COUNTERS_VERSION, "dckpt_manager_counters"));
    const distckpt::ManagerStats s = manager->manager->stats();
    out->steps_saved = s.steps_saved;
    out->steps_completed = s.steps_completed;
    out->steps_failed = s.steps_failed;
    out->saves_waited = s.saves_waited;
    out->saves_waited_for_budget = s.saves_waited_for_budget;
    out->wait_seconds = s.wait_seconds;
    out->max_wait_seconds = s.max_wait_seconds;
    out->bytes_written = s.bytes_written;
    out->bytes_replicated = s.bytes_replicated;
    if (out->version >= 2) {
      out->bytes_persisted = s.bytes_persisted;
      out->bytes_persist_reused = s.bytes_persist_reused;
      out->persist_seconds = s.persist_seconds;
    }
    return DCKPT_OK;
  })
}

int dckpt_manager_latest_step(uint64_t* step, int* found, const dckpt_manager* manager) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(step, "step"));
    DCKPT_RETURN_IF_FAILED(NotNull(found, "found"));
    DCKPT_RETURN_IF_FAILED(NotNull(manager, "manager"));
    auto latest = manager->manager->latest_step();
    *found = latest.has_value();
    *step = latest.value_or(0);
    return DCKPT_OK;
  })
}

int dckpt_manager_restore(dckpt_restore_info* info, dckpt_manager* manager, dckpt_state* state,
                          const dckpt_restore_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(manager, "manager"));
    DCKPT_RETURN_IF_FAILED(NotNull(state, "state"));
    if (info) {
      DCKPT_RETURN_IF_FAILED(
          distckpt::capi::CheckVersion(info->version, DCKPT_RESTORE_INFO_VERSION, "dckpt_restore_info"));
    }
    distckpt::RestoreOptions ro;
    if (opts) {
      DCKPT_RETURN_IF_FAILED(
          distckpt::capi::CheckVersion(opts->version, DCKPT_RESTORE_OPTIONS_VERSION, "dckpt_restore_options"));
      ro.fallback = opts->fallback != 0;
      ro.use_persistent = opts->use_persistent != 0;
    }
    auto r = manager->manager->Restore(state->state, ro);
    if (!r.ok()) return Report(r.status());
    if (info) {
      info->found = r->found;
      info->step = r->step;
      info->tier = static_cast<int>(r->tier);
      info->bytes_local = r->bytes_local;
      info->bytes_from_peers = r->bytes_from_peers;
      info->bytes_from_persistent = r->bytes_from_persistent;
      info->seconds = r->seconds;
      if (info->version >= 2) info->copies_made = r->copies_made;
    }
    return DCKPT_OK;
  })
}

const char* dckpt_manager_restore_report(const dckpt_manager* manager) {
  if (!manager) return "";
  return manager->manager->restore_report().c_str();
}

int dckpt_tiers_describe(const char* dir, dckpt_text_fn out, void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(dir, "dir"));
    DCKPT_RETURN_IF_FAILED(NotNull(reinterpret_cast<const void*>(out), "out"));
    auto report = distckpt::DescribeTier(distckpt::DefaultStorage(), dir);
    if (!report.ok()) return Report(report.status());
    const std::string json = distckpt::TierReportJson(report.value());
    const int rc = out(json.c_str(), json.size(), user_data);
    if (rc != 0) {
      return Report(distckpt::Status(distckpt::StatusCode::kUser,
                                     "the text callback of dckpt_tiers_describe returned " + std::to_string(rc)));
    }
    return DCKPT_OK;
  })
}

int dckpt_tiers_prune_abandoned(const char* dir, int dry_run, dckpt_removed_fn removed, void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(dir, "dir"));
    std::function<distckpt::Status(const std::string&)> report;
    if (removed) {
      report = [removed, user_data](const std::string& p) {
        const int rc = removed(p.c_str(), user_data);
        return rc == 0
                   ? distckpt::OkStatus()
                   : distckpt::Status(distckpt::StatusCode::kUser, "the removed callback stopped the prune at '" + p +
                                                                       "' (it returned " + std::to_string(rc) + ")");
      };
    }
    DCKPT_RETURN_IF_FAILED(distckpt::PruneAbandonedTier(distckpt::DefaultStorage(), dir, dry_run != 0, report));
    return DCKPT_OK;
  })
}
