// The Gloo communicator the Gloo suites test (gloo_conformance_test.cc, gloo_failure_test.cc): the Gloo code linked
// in, or, where the suite is compiled with DCKPT_GLOO_TEST_PLUGIN=1 (gloo_plugin_*_test), the same code behind the
// plugin ABI, loaded from libdistckpt_gloo.so.
#ifndef DISTCKPT_CORE_COMM_GLOO_GLOO_UNDER_TEST_H_
#define DISTCKPT_CORE_COMM_GLOO_GLOO_UNDER_TEST_H_

#include <memory>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/comm/gloo/gloo_options.h"
#if DCKPT_GLOO_TEST_PLUGIN
#include "core/comm/gloo/plugin_loader.h"
#else
#include "core/comm/gloo/gloo.h"
#endif

namespace distckpt {
namespace gloo_testing {

inline Result<std::unique_ptr<Communicator>> NewGlooForTest(const GlooOptions& options) {
#if DCKPT_GLOO_TEST_PLUGIN
  return NewGlooCommunicatorFromPlugin(options);
#else
  return NewGlooCommunicator(options);
#endif
}

}  // namespace gloo_testing
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_UNDER_TEST_H_
