/* Stand-ins for libdistckpt_gloo.so in plugin_loader_test: a shared library that is no Gloo plugin (FAKE_NO_ENTRY),
 * and plugins whose table announces another distckpt version (FAKE_VERSION) or another plugin ABI (FAKE_ABI). Their
 * functions are never called: the loader refuses them first. */
#include "core/comm/gloo/plugin_abi.h"

#ifdef FAKE_NO_ENTRY
__attribute__((visibility("default"))) int fake_gloo_plugin_without_entry(void) { return 0; }
#else
#ifndef FAKE_ABI
#define FAKE_ABI DCKPT_GLOO_PLUGIN_ABI
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION "0.0.0-unset"
#endif
static const dckpt_gloo_plugin_api kApi = {FAKE_ABI, sizeof(dckpt_gloo_plugin_api), FAKE_VERSION};

__attribute__((visibility("default"))) const dckpt_gloo_plugin_api *dckpt_gloo_plugin_entry(void) { return &kApi; }
#endif
