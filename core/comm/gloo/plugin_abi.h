/* The internal C ABI between the core (libdistckpt.so, libdistckpt.a, the Python extension) and the Gloo plugin
 * (libdistckpt_gloo.so, plugin.cc). Not public: both sides are built from one source tree, and the core accepts only
 * a plugin of its own version (DCKPT_VERSION_STRING) and of this DCKPT_GLOO_PLUGIN_ABI.
 *
 * Why a C table: the two sides are built by different toolchains (the core with libc++ linked in, the plugin with
 * Debian's libstdc++, since libgloo.so is built against it), so nothing C++ crosses: no std::string, no smart pointer,
 * no exception. The rules:
 *  - Every function that can fail returns a status: 0, or a negative value of the core's StatusCode
 *    (core/base/status.h, the same numbers as the public DCKPT_E* codes, which never change), and writes the message
 *    into `message`.
 *  - Output of variable size goes into buffers the host owns, through dckpt_gloo_plugin_bytes: the plugin asks the
 *    host to size the buffer and copies into it. The plugin never frees host memory, and the host never frees plugin
 *    memory (a communicator is released with destroy()).
 *  - No function of the table throws or lets an exception out.
 *  - A communicator is used by one thread at a time, as Communicator (core/comm/communicator.h) requires.
 * Changing anything below means incrementing DCKPT_GLOO_PLUGIN_ABI. */
#ifndef DISTCKPT_CORE_COMM_GLOO_PLUGIN_ABI_H_
#define DISTCKPT_CORE_COMM_GLOO_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DCKPT_GLOO_PLUGIN_ABI 3u
/* The plugin's file name: the loader looks for it beside the binary that holds the core. */
#define DCKPT_GLOO_PLUGIN_FILE "libdistckpt_gloo.so"
/* The one symbol the plugin exports (a dckpt_gloo_plugin_entry_fn). */
#define DCKPT_GLOO_PLUGIN_ENTRY "dckpt_gloo_plugin_entry"

/* A Gloo communicator inside the plugin. */
typedef struct dckpt_gloo_plugin_comm dckpt_gloo_plugin_comm;

/* A byte buffer the host owns. resize(buf, n) makes it n bytes long and returns its first byte (not NULL when n is 0),
 * or NULL when the host is out of memory; the plugin then writes exactly n bytes there. */
typedef struct dckpt_gloo_plugin_bytes {
  void *buf;
  char *(*resize)(void *buf, size_t n);
} dckpt_gloo_plugin_bytes;

/* GlooOptions (core/comm/gloo/gloo_options.h) as C: the strings are never NULL ("" when unset). */
typedef struct dckpt_gloo_plugin_options {
  int rank;
  int world_size;
  const char *rendezvous;
  const char *prefix;
  const char *iface;
  const char *hostname;
  int64_t timeout_ms;
} dckpt_gloo_plugin_options;

/* One message of send_recv: `size` bytes at `data` for rank `peer`. */
typedef struct dckpt_gloo_plugin_send {
  int peer;
  const char *data;
  size_t size;
} dckpt_gloo_plugin_send;

/* One receive of send_recv: what rank `peer` sends, into `into`. */
typedef struct dckpt_gloo_plugin_recv {
  int peer;
  dckpt_gloo_plugin_bytes into;
} dckpt_gloo_plugin_recv;

/* One receive of send_recv_into: exactly `size` bytes from rank `peer`, written at `data`. */
typedef struct dckpt_gloo_plugin_recv_into {
  int peer;
  char *data;
  size_t size;
} dckpt_gloo_plugin_recv_into;

/* What the plugin offers: one function per operation of Communicator, with the same contract (timeouts in ms).
 * `abi` and `struct_size` come first and stay first in every later ABI, so that any loader can read them. */
typedef struct dckpt_gloo_plugin_api {
  uint32_t abi;         /* DCKPT_GLOO_PLUGIN_ABI of the plugin */
  uint32_t struct_size; /* sizeof(dckpt_gloo_plugin_api) of the plugin */
  const char *version;  /* DCKPT_VERSION_STRING of the tree the plugin was built from */

  /* Joins the group (collective), as NewGlooCommunicator; *out is set on success. */
  int (*create)(dckpt_gloo_plugin_comm **out, const dckpt_gloo_plugin_options *options,
                dckpt_gloo_plugin_bytes *message);
  /* Closes the connections and frees the communicator; NULL is ignored. */
  void (*destroy)(dckpt_gloo_plugin_comm *comm);
  int (*rank)(const dckpt_gloo_plugin_comm *comm);
  int (*size)(const dckpt_gloo_plugin_comm *comm);
  /* `all` has size() entries; on success entry r holds rank r's contribution. */
  int (*all_gather)(dckpt_gloo_plugin_comm *comm, const char *mine, size_t mine_size, dckpt_gloo_plugin_bytes *all,
                    int64_t timeout_ms, dckpt_gloo_plugin_bytes *message);
  /* As all_gather, but only on `root` are the entries of `all` written. */
  int (*gather)(dckpt_gloo_plugin_comm *comm, const char *mine, size_t mine_size, int root,
                dckpt_gloo_plugin_bytes *all, int64_t timeout_ms, dckpt_gloo_plugin_bytes *message);
  /* `root`'s `data` reaches every rank's `out`, which is written on the other ranks only. `out` may be the buffer
   * `data` points into: the plugin has read `data` before it resizes `out`. */
  int (*broadcast)(dckpt_gloo_plugin_comm *comm, const char *data, size_t size, int root, dckpt_gloo_plugin_bytes *out,
                   int64_t timeout_ms, dckpt_gloo_plugin_bytes *message);
  int (*barrier)(dckpt_gloo_plugin_comm *comm, int64_t timeout_ms, dckpt_gloo_plugin_bytes *message);
  /* Communicator::SendRecv; the receive buffers are written on success only. */
  int (*send_recv)(dckpt_gloo_plugin_comm *comm, const dckpt_gloo_plugin_send *sends, size_t n_sends,
                   const dckpt_gloo_plugin_recv *recvs, size_t n_recvs, int64_t timeout_ms,
                   dckpt_gloo_plugin_bytes *message);
  /* Communicator::Abort; `reason` is never NULL. */
  void (*abort)(dckpt_gloo_plugin_comm *comm, const char *reason);
  /* Communicator::SendRecvInto (ABI 2): each payload received straight into the host's memory. ABI 3: several
   * messages to one peer in one call, matched in order (Communicator::SendRecvInto). */
  int (*send_recv_into)(dckpt_gloo_plugin_comm *comm, const dckpt_gloo_plugin_send *sends, size_t n_sends,
                        const dckpt_gloo_plugin_recv_into *recvs, size_t n_recvs, int64_t timeout_ms,
                        dckpt_gloo_plugin_bytes *message);
} dckpt_gloo_plugin_api;

/* The type of DCKPT_GLOO_PLUGIN_ENTRY: the plugin's table, valid for the life of the process. */
typedef const dckpt_gloo_plugin_api *(*dckpt_gloo_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTCKPT_CORE_COMM_GLOO_PLUGIN_ABI_H_ */
