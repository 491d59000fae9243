// The communicator part of the C ABI: Gloo over TCP (the Gloo plugin, loaded at run time), NCCL (loaded at run time)
// and external (host-supplied) collectives.
#include <cstddef>
#include <cstring>
#include <string>

#include "capi/capi_internal.h"
#include "capi/include/distckpt/distckpt.h"
#include "core/comm/external/external.h"
#include "core/comm/gloo/plugin_loader.h"
#include "core/comm/nccl/nccl.h"

using distckpt::OkStatus;
using distckpt::Status;
using distckpt::capi::CheckVersion;
using distckpt::capi::NotNull;
using distckpt::capi::Report;
using distckpt::capi::ReportException;

extern "C" {

int dckpt_gloo_options_init(dckpt_gloo_options* opts, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_gloo_options>(opts, "opts", DCKPT_GLOO_OPTIONS_INIT, version,
                                                           DCKPT_GLOO_OPTIONS_VERSION, "dckpt_gloo_options");
}

int dckpt_comm_new_gloo(dckpt_comm** out, const dckpt_gloo_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    distckpt::GlooOptions o;
    if (opts) {
      DCKPT_RETURN_IF_FAILED(CheckVersion(opts->version, DCKPT_GLOO_OPTIONS_VERSION, "dckpt_gloo_options"));
      o.rank = opts->rank;
      o.world_size = opts->world_size;
      if (opts->rendezvous) o.rendezvous = opts->rendezvous;
      if (opts->prefix) o.prefix = opts->prefix;
      if (opts->iface) o.iface = opts->iface;
      if (opts->hostname) o.hostname = opts->hostname;
      if (opts->timeout_ms) o.timeout = std::chrono::milliseconds(opts->timeout_ms);
    }
    auto filled = distckpt::GlooOptionsFromEnv(o);
    if (!filled.ok()) return Report(filled.status());
    auto comm = distckpt::NewGlooCommunicatorFromPlugin(*filled);
    if (!comm.ok()) return Report(comm.status());
    *out = new dckpt_comm{std::move(comm).value()};
    return DCKPT_OK;
  })
}

int dckpt_nccl_options_init(dckpt_nccl_options* opts, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_nccl_options>(opts, "opts", DCKPT_NCCL_OPTIONS_INIT, version,
                                                           DCKPT_NCCL_OPTIONS_VERSION, "dckpt_nccl_options");
}

int dckpt_comm_new_nccl(dckpt_comm** out, dckpt_comm* bootstrap, const dckpt_nccl_options* opts) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    DCKPT_RETURN_IF_FAILED(NotNull(bootstrap, "bootstrap"));
    distckpt::NcclOptions o;
    if (opts) {
      DCKPT_RETURN_IF_FAILED(CheckVersion(opts->version, DCKPT_NCCL_OPTIONS_VERSION, "dckpt_nccl_options"));
      if (opts->device < -1) {
        return Report(distckpt::InvalidArgument("dckpt_nccl_options.device must be -1 (the current device) or a "
                                                "CUDA device ordinal, not " + std::to_string(opts->device)));
      }
      o.device = opts->device;
      o.timeout = distckpt::capi::Timeout(opts->timeout_ms);
    }
    auto comm = distckpt::NewNcclCommunicator(distckpt::capi::CommunicatorOf(bootstrap), o);
    if (!comm.ok()) return Report(comm.status());
    *out = new dckpt_comm{std::move(comm).value()};
    return DCKPT_OK;
  })
}

int dckpt_comm_callbacks_init(dckpt_comm_callbacks* callbacks, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_comm_callbacks>(callbacks, "callbacks", DCKPT_COMM_CALLBACKS_INIT, version,
                                                             DCKPT_COMM_CALLBACKS_VERSION, "dckpt_comm_callbacks");
}

int dckpt_comm_new_external(dckpt_comm** out, const dckpt_comm_callbacks* callbacks) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    DCKPT_RETURN_IF_FAILED(NotNull(callbacks, "callbacks"));
    DCKPT_RETURN_IF_FAILED(CheckVersion(callbacks->version, DCKPT_COMM_CALLBACKS_VERSION, "dckpt_comm_callbacks"));
    distckpt::ExternalCallbacks cb;
    cb.rank = callbacks->rank;
    cb.size = callbacks->size;
    cb.allgather = callbacks->allgather;
    cb.broadcast = callbacks->broadcast;
    cb.barrier = callbacks->barrier;
    cb.user_data = callbacks->user_data;
    auto comm = distckpt::NewExternalCommunicator(cb);
    if (!comm.ok()) return Report(comm.status());
    *out = new dckpt_comm{std::move(comm).value()};
    return DCKPT_OK;
  })
}

void dckpt_comm_free(dckpt_comm* comm) { delete comm; }

int dckpt_comm_rank(int* out, const dckpt_comm* comm) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(comm, "comm"));
    *out = comm->comm->rank();
    return DCKPT_OK;
  })
}

int dckpt_comm_size(int* out, const dckpt_comm* comm) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(comm, "comm"));
    *out = comm->comm->size();
    return DCKPT_OK;
  })
}

int dckpt_comm_barrier(dckpt_comm* comm, uint64_t timeout_ms) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(comm, "comm"));
    return Report(comm->comm->Barrier(distckpt::capi::Timeout(timeout_ms)));
  })
}

int dckpt_comm_abort(dckpt_comm* comm, const char* reason) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(comm, "comm"));
    comm->comm->Abort(reason ? reason : "no reason given");
    return DCKPT_OK;
  })
}

}  // extern "C"
