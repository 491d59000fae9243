// The Gloo communicator as the core (libdistckpt.so, libdistckpt.a, the Python extension) gets it: from the Gloo
// plugin, libdistckpt_gloo.so, loaded with dlopen on first use, so that the core needs nothing but the C library and
// Gloo, hiredis, ibverbs and libnl are loaded only by a process that joins a Gloo group. Reading, saving with a
// single-process or external communicator, S3 and the checkpoint manager never load it.
//
// Where the plugin is looked for, first match wins:
//   1. DCKPT_GLOO_PLUGIN, a file path; when it is set, nothing else is tried;
//   2. beside the binary that holds this code: libdistckpt.so, or the executable or extension module that links the
//      core statically (found with dladdr; /proc/self/exe for an executable);
//   3. beside that binary's real path, where it differs (a link to it, as in Bazel's _solib directories).
// The plugin is loaded once per process (RTLD_NOW | RTLD_LOCAL) and never unloaded. It must come from the same build
// as the core: the same DCKPT_VERSION_STRING and plugin ABI (plugin_abi.h).
#ifndef DISTCKPT_CORE_COMM_GLOO_PLUGIN_LOADER_H_
#define DISTCKPT_CORE_COMM_GLOO_PLUGIN_LOADER_H_

#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/comm/gloo/gloo_options.h"
#include "core/comm/gloo/plugin_abi.h"

namespace distckpt {

/// NewGlooCommunicator (gloo.h) through the plugin: checks the options (CheckGlooOptions) before anything is loaded,
/// then loads the plugin and joins the group. The communicator behaves as the Gloo one does, with the same errors.
/// Besides NewGlooCommunicator's errors: LoadGlooPlugin's.
Result<std::unique_ptr<Communicator>> NewGlooCommunicatorFromPlugin(const GlooOptions& options);

/// The plugin's table, loaded on the first successful call; later calls return the same table. A failure is not
/// remembered, so a later call (e.g. after DCKPT_GLOO_PLUGIN was set) tries again. Fails with kUnsupported when no
/// candidate loads, or kVersion when one is a Gloo plugin of another distckpt version or plugin ABI; the message names
/// every file tried with the reason (dlerror's words), and the ways out: DCKPT_GLOO_PLUGIN, or a communicator of the
/// application's own (external). Thread-safe.
Result<const dckpt_gloo_plugin_api*> LoadGlooPlugin();

/// The files LoadGlooPlugin tries, in order (the header comment says which).
std::vector<std::string> GlooPluginCandidates();

}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_PLUGIN_LOADER_H_
