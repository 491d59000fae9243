// Shared between the C ABI's translation units: handle definitions and error reporting.
#ifndef DISTCKPT_CAPI_CAPI_INTERNAL_H_
#define DISTCKPT_CAPI_CAPI_INTERNAL_H_

#include <memory>

#include "capi/include/distckpt/distckpt.h"
#include "core/base/status.h"
#include "core/comm/communicator.h"

struct dckpt_comm {
  std::unique_ptr<distckpt::Communicator> comm;
};

namespace distckpt {
namespace capi {

/// Records a failed status as the calling thread's last error and returns its code (0 for OK).
int Report(const Status& st);
/// Call inside catch (...): converts the active exception into a status.
int ReportException();
inline Communicator* CommunicatorOf(dckpt_comm* c) { return c->comm.get(); }

}  // namespace capi
}  // namespace distckpt

#endif  // DISTCKPT_CAPI_CAPI_INTERNAL_H_
