/*
 * distckpt.h: the C ABI of distckpt, a distributed checkpointing library.
 *
 * C99; also compiles as C++. Conventions (see capi/API.md for ownership, threading and stability):
 *  - Every function returns an int status: DCKPT_OK (0) or a negative DCKPT_E* code. dckpt_error_last() gives the
 *    calling thread's message for the last failure. Codes are never renumbered.
 *  - Out-parameters come first. Whatever comes back through `**out` is owned by the caller and released with that
 *    type's _free(), which accepts NULL. Pointers returned inside info structs are borrowed from their parent handle.
 *  - Option and info structs start with `unsigned version`; set it with the _INIT macro or the _init() function.
 *    Fields are only ever appended. NULL options mean the defaults.
 *  - A NULL communicator means a single process.
 *  - Callbacks take `void *user_data` last; a non-zero return aborts the operation with DCKPT_EUSER.
 */
#ifndef DISTCKPT_DISTCKPT_H_
#define DISTCKPT_DISTCKPT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DCKPT_API __attribute__((visibility("default")))
#else
#define DCKPT_API
#endif

/* ---- Versions ------------------------------------------------------------------------------------------------- */

#define DCKPT_VERSION_MAJOR 0
#define DCKPT_VERSION_MINOR 1
#define DCKPT_VERSION_PATCH 0
#define DCKPT_VERSION_STRING "0.1.0"
/* Bumped only if a released symbol or struct layout ever has to change incompatibly (it should not). Bindings
 * compare it with dckpt_abi_version() when they load. */
#define DCKPT_ABI_VERSION 1

/* MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library. */
DCKPT_API unsigned dckpt_version(void);
/* The loaded library's version as "MAJOR.MINOR.PATCH" (static; never freed). */
DCKPT_API const char *dckpt_version_string(void);
/* The loaded library's DCKPT_ABI_VERSION; a binding refuses a library whose value differs from its header's. */
DCKPT_API unsigned dckpt_abi_version(void);

/* ---- Status codes and errors ---------------------------------------------------------------------------------- */

typedef enum dckpt_status {
  DCKPT_OK = 0,
  DCKPT_ERROR = -1,        /* an error that fits no other code */
  DCKPT_EINVAL = -2,       /* invalid argument */
  DCKPT_ENOTFOUND = -3,    /* checkpoint, entry or file not found */
  DCKPT_ECORRUPT = -4,     /* checksum mismatch, bad metadata, truncated or missing data file */
  DCKPT_EVERSION = -5,     /* unsupported format or ABI version */
  DCKPT_EIO = -6,          /* the operating system reported an I/O error */
  DCKPT_ETIMEOUT = -7,     /* a collective or wait ran past its timeout (a rank died or stalled) */
  DCKPT_EUSER = -8,        /* a callback returned non-zero */
  DCKPT_ENOMEM = -9,       /* out of memory */
  DCKPT_EUNSUPPORTED = -10,/* not supported by this build or backend */
  DCKPT_EEXISTS = -11,     /* the target already exists */
  DCKPT_EBUFSIZE = -12,    /* the caller's buffer is too small; the needed size is reported */
  DCKPT_EPEER = -13,       /* another rank failed, so this one did too */
  DCKPT_ENOSPC = -14,      /* no space left on the device */
  DCKPT_ESTATE = -15,      /* the object is in the wrong state for this call */
  DCKPT_EINTERNAL = -16    /* a bug in distckpt */
} dckpt_status;

/* The calling thread's message for its last failed call ("" if none). Valid until the thread's next dckpt call. */
DCKPT_API const char *dckpt_error_last(void);
/* The calling thread's last failure code (DCKPT_OK if none). */
DCKPT_API int dckpt_error_last_code(void);
/* Forgets the calling thread's last failure: dckpt_error_last() then gives "" and dckpt_error_last_code() DCKPT_OK,
 * until the next failed call. Lets a caller tell a new failure from an old one (successful calls leave both as
 * they were). */
DCKPT_API void dckpt_error_clear(void);
/* A short static name for a status code, e.g. "corrupt". */
DCKPT_API const char *dckpt_status_name(int status);

/* ---- Element types (stored little-endian; names match safetensors where it has one) ---------------------------- */

typedef enum dckpt_dtype {
  DCKPT_DTYPE_BOOL = 1,
  DCKPT_DTYPE_U8 = 2,
  DCKPT_DTYPE_I8 = 3,
  DCKPT_DTYPE_U16 = 4,
  DCKPT_DTYPE_I16 = 5,
  DCKPT_DTYPE_U32 = 6,
  DCKPT_DTYPE_I32 = 7,
  DCKPT_DTYPE_U64 = 8,
  DCKPT_DTYPE_I64 = 9,
  DCKPT_DTYPE_F16 = 10,
  DCKPT_DTYPE_BF16 = 11,
  DCKPT_DTYPE_F32 = 12,
  DCKPT_DTYPE_F64 = 13,
  DCKPT_DTYPE_C64 = 14,
  DCKPT_DTYPE_C128 = 15,
  DCKPT_DTYPE_F8_E4M3FN = 16,
  DCKPT_DTYPE_F8_E5M2 = 17
} dckpt_dtype;

/* Bytes per element; 0 for an unknown dtype. */
DCKPT_API size_t dckpt_dtype_size(int dtype);
/* Canonical name ("F32", "BF16", "F8_E4M3"); NULL for an unknown dtype. */
DCKPT_API const char *dckpt_dtype_name(int dtype);
/* Parses a canonical or numpy-style name ("float32"). */
DCKPT_API int dckpt_dtype_from_name(int *out, const char *name);

#define DCKPT_MAX_DIMS 8

typedef enum dckpt_entry_kind { DCKPT_ENTRY_TENSOR = 0, DCKPT_ENTRY_BYTES = 1 } dckpt_entry_kind;

/* ---- Communicators ------------------------------------------------------------------------------------------- */

/* A group of ranks that coordinate a save or load. NULL means a single process. One collective at a time. */
typedef struct dckpt_comm dckpt_comm;

/* Progress: done and total bytes so far. Return non-zero to abort (DCKPT_EUSER). Called from internal threads, one
 * call at a time. */
typedef int (*dckpt_progress_fn)(uint64_t done, uint64_t total, void *user_data);

#define DCKPT_GLOO_OPTIONS_VERSION 1
typedef struct dckpt_gloo_options {
  unsigned version;
  int rank;               /* -1: from the environment (DCKPT_RANK, else RANK) */
  int world_size;         /* -1: from the environment (DCKPT_WORLD_SIZE, else WORLD_SIZE) */
  const char *rendezvous; /* "file:///shared/dir" or "redis://host:port"; NULL: DCKPT_RENDEZVOUS */
  const char *prefix;     /* namespace of this group in the store (e.g. a job id); NULL: none */
  const char *iface;      /* network interface to bind; NULL: DCKPT_GLOO_IFACE, else Gloo's default */
  const char *hostname;   /* address to bind; NULL: DCKPT_GLOO_HOSTNAME, else Gloo's default */
  uint64_t timeout_ms;    /* rendezvous and default collective timeout; 0: DCKPT_TIMEOUT_MS, else 10 minutes */
} dckpt_gloo_options;
#define DCKPT_GLOO_OPTIONS_INIT {DCKPT_GLOO_OPTIONS_VERSION, -1, -1, NULL, NULL, NULL, NULL, 0}
/* Sets `*opts` to DCKPT_GLOO_OPTIONS_INIT with `version` (DCKPT_GLOO_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_gloo_options_init(dckpt_gloo_options *opts, unsigned version);
/* Connects this rank to the others through Gloo over TCP (collective: every rank calls it). NULL options: everything
 * comes from the environment. */
DCKPT_API int dckpt_comm_new_gloo(dckpt_comm **out, const dckpt_gloo_options *opts);

/* NCCL: byte collectives run as NCCL collectives on the GPU of this rank (one rank per GPU). libnccl.so.2 and the
 * CUDA driver (libcuda.so.1) are loaded the first time this is called, so one libdistckpt.so serves machines with and
 * without GPUs; without them the call fails with DCKPT_EUNSUPPORTED naming what is missing. See capi/API.md, "NCCL". */
#define DCKPT_NCCL_OPTIONS_VERSION 1
typedef struct dckpt_nccl_options {
  unsigned version;
  int device;          /* CUDA device ordinal of this rank; -1: the device of the calling thread's current context,
                        * else device 0 (default -1) */
  uint64_t timeout_ms; /* creating the communicator, and the default for its collectives; 0: 10 minutes */
} dckpt_nccl_options;
#define DCKPT_NCCL_OPTIONS_INIT {DCKPT_NCCL_OPTIONS_VERSION, -1, 0}
/* Sets `*opts` to DCKPT_NCCL_OPTIONS_INIT with `version` (DCKPT_NCCL_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_nccl_options_init(dckpt_nccl_options *opts, unsigned version);
/* Creates an NCCL communicator over the ranks of `bootstrap` (collective over `bootstrap`, e.g. a Gloo group, which is
 * used only during this call, to broadcast rank 0's NCCL unique id; it may be freed afterwards). NULL opts: the
 * defaults. */
DCKPT_API int dckpt_comm_new_nccl(dckpt_comm **out, dckpt_comm *bootstrap, const dckpt_nccl_options *opts);

/* Collectives supplied by the host application (torch.distributed, mpi4py, a JAX client...). Each returns 0 on
 * success; non-zero aborts the operation with DCKPT_EUSER. The fields of dckpt_comm_callbacks say what each must do. */
/* dckpt_comm_callbacks.allgather */
typedef int (*dckpt_comm_allgather_fn)(const void *send, size_t send_size, void *recv, uint64_t timeout_ms,
                                       void *user_data);
/* dckpt_comm_callbacks.broadcast */
typedef int (*dckpt_comm_broadcast_fn)(void *buf, size_t size, int root, uint64_t timeout_ms, void *user_data);
/* dckpt_comm_callbacks.barrier */
typedef int (*dckpt_comm_barrier_fn)(uint64_t timeout_ms, void *user_data);
#define DCKPT_COMM_CALLBACKS_VERSION 1
typedef struct dckpt_comm_callbacks {
  unsigned version;
  int rank;
  int size;
  /* Every rank passes send_size bytes (the same on all ranks for one call); recv has room for size * send_size
   * bytes and receives every rank's bytes in rank order. */
  dckpt_comm_allgather_fn allgather;
  /* buf holds size bytes: root's are sent, every other rank's are overwritten. */
  dckpt_comm_broadcast_fn broadcast;
  /* Optional (NULL: an allgather of one byte). */
  dckpt_comm_barrier_fn barrier;
  void *user_data;
} dckpt_comm_callbacks;
#define DCKPT_COMM_CALLBACKS_INIT {DCKPT_COMM_CALLBACKS_VERSION, 0, 1, NULL, NULL, NULL, NULL}
/* Sets `*callbacks` to DCKPT_COMM_CALLBACKS_INIT with `version` (DCKPT_COMM_CALLBACKS_VERSION, or an older one: then
 * only that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_comm_callbacks_init(dckpt_comm_callbacks *callbacks, unsigned version);
/* Wraps the host's collectives; the callbacks and user_data must stay valid until dckpt_comm_free. */
DCKPT_API int dckpt_comm_new_external(dckpt_comm **out, const dckpt_comm_callbacks *callbacks);
/* Releases `comm` (NULL is fine). No call or unfinished dckpt_save_async may still be using it. */
DCKPT_API void dckpt_comm_free(dckpt_comm *comm);
/* This process's rank in the group, 0..size-1. */
DCKPT_API int dckpt_comm_rank(int *out, const dckpt_comm *comm);
/* The number of ranks in the group. */
DCKPT_API int dckpt_comm_size(int *out, const dckpt_comm *comm);
/* Waits until every rank arrives; DCKPT_ETIMEOUT naming a missing rank after timeout_ms (0: the default). */
DCKPT_API int dckpt_comm_barrier(dckpt_comm *comm, uint64_t timeout_ms);
/* Tells the group this rank cannot take part (it failed before reaching a collective), so that ranks waiting on it
 * fail at once, naming it, instead of waiting out their timeouts. With Gloo the connections are closed; with external
 * callbacks it does nothing (the host owns the transport). The communicator is unusable afterwards. */
DCKPT_API int dckpt_comm_abort(dckpt_comm *comm, const char *reason);

/* ---- Storage: where checkpoints live ------------------------------------------------------------------------- */

/* A storage backend: the built-in POSIX file system, an in-process memory store, or storage the host plugs in through
 * callbacks (an object store client, fsspec, an SDK). Passed through the `storage` field of the save, read and export
 * options (NULL there: the POSIX file system). Thread-safe; distckpt calls a storage from several threads at once.
 * dckpt_storage_free drops the caller's reference: readers and async saves that use the storage keep it alive until
 * they are freed or finish. See FORMAT.md "Commit on storage without rename" for what is written where. */
typedef struct dckpt_storage dckpt_storage;
/* The sink dckpt_storage_callbacks.list reports names into (valid only during that call). */
typedef struct dckpt_storage_list dckpt_storage_list;
/* A file a write callback writes into: the host's own handle, returned by `create`. */
typedef void dckpt_storage_file;
/* A multipart upload: the host's own handle, returned by `upload_begin` (version 2). */
typedef void dckpt_upload;

/* Storage supplied by the host. Paths are '/'-separated strings exactly as the caller passed them to dckpt_save /
 * dckpt_reader_open, joined with plain file names ("<checkpoint>/metadata.dckpt"); the host decides what they mean (an
 * object key, a bucket and key, a local path). There are no directories to create or rename: a "directory" is the
 * set of paths below a prefix. Every callback returns 0 on success or a negative DCKPT_E* code (DCKPT_ENOTFOUND for
 * a missing path, DCKPT_ENOSPC, DCKPT_EIO...); any other non-zero value is DCKPT_EUSER. Callbacks are called from
 * several threads at once (at most `max_in_flight` write/read/upload_part calls together), so they must be
 * thread-safe; a callback may set no distckpt error (dckpt_error_last is distckpt's, it names the path and the
 * operation). */
/* The callback types of dckpt_storage_callbacks, one per field (its comment there says what the callback must do). */
typedef int (*dckpt_storage_create_fn)(dckpt_storage_file **file, const char *path, uint64_t size_hint,
                                       void *user_data);
typedef int (*dckpt_storage_write_fn)(dckpt_storage_file *file, uint64_t offset, const void *data, size_t size,
                                      void *user_data);
typedef int (*dckpt_storage_sync_fn)(dckpt_storage_file *file, void *user_data);
typedef int (*dckpt_storage_close_fn)(dckpt_storage_file *file, uint64_t size, int discard, void *user_data);
typedef int (*dckpt_storage_size_fn)(uint64_t *size, const char *path, void *user_data);
typedef int (*dckpt_storage_read_fn)(size_t *got, const char *path, uint64_t offset, void *data, size_t size,
                                     void *user_data);
typedef int (*dckpt_storage_list_fn)(dckpt_storage_list *out, const char *dir, void *user_data);
typedef int (*dckpt_storage_remove_fn)(const char *path, void *user_data);
typedef int (*dckpt_storage_commit_fn)(const char *path, const void *data, size_t size, int replace, void *user_data);
typedef int (*dckpt_storage_upload_begin_fn)(dckpt_upload **upload, const char *path, uint64_t size_hint,
                                             void *user_data);
typedef int (*dckpt_storage_upload_part_fn)(dckpt_upload *upload, unsigned part_number, const void *data, size_t size,
                                            void *user_data);
typedef int (*dckpt_storage_upload_end_fn)(dckpt_upload *upload, void *user_data); /* upload_complete, upload_abort */
typedef void (*dckpt_storage_release_fn)(void *user_data);
#define DCKPT_STORAGE_CALLBACKS_VERSION 2
typedef struct dckpt_storage_callbacks {
  unsigned version;
  /* Starts writing `path`, replacing what is there when the file is closed. `size_hint` is the final size when known
   * (0: unknown). Nothing is visible at `path` before `close` returns 0 with discard == 0. */
  dckpt_storage_create_fn create;
  /* Writes `size` bytes at `offset`. Calls for one file may come from several threads at once, for disjoint ranges,
   * in any order; bytes never written read as zeros. */
  dckpt_storage_write_fn write;
  /* Optional (NULL: nothing to do): makes what was written so far durable. */
  dckpt_storage_sync_fn sync;
  /* Finishes the file: discard == 0 publishes it at its path, durably, of size `size` (the largest offset + size
   * written, or more: the rest is zeros); discard != 0 abandons it (nothing appears). Called exactly once per file. */
  dckpt_storage_close_fn close;
  /* The size of the file at `path`; DCKPT_ENOTFOUND when there is none. */
  dckpt_storage_size_fn size;
  /* Reads `size` bytes at `offset` of `path` into `data`; `*got` is how many it read (fewer only at the end of the
   * file). Calls may come from several threads at once. */
  dckpt_storage_read_fn read;
  /* Reports, through dckpt_storage_list_add, the names directly below `dir` (files, and the first component of
   * longer paths: "a/b/c" is reported as "b" when listing "a"), each once, in any order. A `dir` with nothing below
   * it is not an error (report nothing). */
  dckpt_storage_list_fn list;
  /* Removes the file at `path`; 0 when there is none. */
  dckpt_storage_remove_fn remove;
  /* Optional: the commit. Writes the `size` bytes at `data` to `path` (a checkpoint's metadata) as one atomic, durable
   * step: readers see the old content (or nothing) or all of the new. With `replace` == 0 it must fail with
   * DCKPT_EEXISTS when something is already at `path` (S3: a conditional PUT with If-None-Match: *). NULL: distckpt
   * uses create/write/close after checking that nothing is there when replace == 0 (a check another writer can race). */
  dckpt_storage_commit_fn commit;
  void *user_data;
  unsigned max_in_flight; /* most write, read and upload_part callbacks running at once; 0: default (16) */
  /* ---- Version 2 ---- */
  /* Optional multipart uploads (all four, or none). With them, distckpt assembles a written file into parts itself:
   * it buffers the writes (at most a few parts per file, never the whole file), sends each part as soon as its bytes
   * are in, completes the upload on close and aborts it when the file is discarded or a call fails. A file of at most
   * one part goes through create/write/close instead (one write at offset 0, then close), as does the metadata.
   * upload_begin starts an upload of `path` (`size_hint`: the final size when known, 0: unknown); nothing is visible
   * at `path` before upload_complete returns 0. */
  dckpt_storage_upload_begin_fn upload_begin;
  /* Sends part `part_number` (from 1, consecutive, started in order; several parts of one upload may be in flight at
   * once from different threads). Every part but the last is the same size, at least min_part_size. `data` is valid
   * only during the call. */
  dckpt_storage_upload_part_fn upload_part;
  /* Publishes the object from all the parts sent (called once, after every upload_part returned 0). The last call on
   * the upload: after a failure here the host cleans up the upload itself (no upload_abort follows). */
  dckpt_storage_upload_end_fn upload_complete;
  /* Abandons the upload and whatever parts went up (called once, instead of upload_complete, after every upload_part
   * call returned); nothing appears at the path. */
  dckpt_storage_upload_end_fn upload_abort;
  /* The size of every part but the last (0: 8 MiB); grown so that a file of size_hint bytes needs at most 10000
   * parts (S3's limit). */
  uint64_t min_part_size;
  /* Optional: called once with user_data when the storage and everything using it have been freed (after the last
   * callback returned), so that a host need not keep user_data alive by hand. Not called when
   * dckpt_storage_new_callbacks fails. */
  dckpt_storage_release_fn release;
} dckpt_storage_callbacks;
#define DCKPT_STORAGE_CALLBACKS_INIT \
  {DCKPT_STORAGE_CALLBACKS_VERSION, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, \
   NULL, NULL, NULL, NULL, 0, NULL}
/* Sets `*callbacks` to DCKPT_STORAGE_CALLBACKS_INIT with `version` (DCKPT_STORAGE_CALLBACKS_VERSION, or an older
 * one: then only that version's fields are written); DCKPT_EVERSION for a version newer than the library. For
 * bindings, which cannot expand the macro. */
DCKPT_API int dckpt_storage_callbacks_init(dckpt_storage_callbacks *callbacks, unsigned version);
/* Storage through the host's callbacks (create, write, close, size, read, list and remove are required). The callbacks
 * and user_data must stay valid until the storage and everything that uses it are freed (`release` says when).
 * Checkpoints on it are committed by writing the metadata last (FORMAT.md), never by renaming. */
DCKPT_API int dckpt_storage_new_callbacks(dckpt_storage **out, const dckpt_storage_callbacks *callbacks);
/* The POSIX file system (what NULL storage means). */
DCKPT_API int dckpt_storage_new_posix(dckpt_storage **out);
/* An in-process store of files (lost when freed), committed like callback storage: for tests and examples. */
DCKPT_API int dckpt_storage_new_memory(dckpt_storage **out);
/* Drops the caller's reference (NULL is fine); readers and async saves using the storage keep it alive until they
 * are freed or finish. */
DCKPT_API void dckpt_storage_free(dckpt_storage *storage);
/* For a list callback: adds one name (a plain name, no '/'). */
DCKPT_API int dckpt_storage_list_add(dckpt_storage_list *list, const char *name);

/* ---- S3 and URLs ------------------------------------------------------------------------------------------------ */

/* Every call that takes a checkpoint path and a storage (dckpt_save, dckpt_save_async, dckpt_load, dckpt_reader_open,
 * dckpt_storage_stat, dckpt_storage_remove_leftovers, dckpt_storage_remove_checkpoint, dckpt_storage_list_dir,
 * dckpt_export_safetensors) takes a URL in place of the path when the storage is NULL: "s3://bucket/prefix" is S3
 * configured from the environment (dckpt_storage_open_url), a plain path the POSIX file system, and any other scheme
 * DCKPT_EUNSUPPORTED naming it and what would serve it. With a storage from dckpt_storage_new_s3 the paths are
 * "s3://bucket/prefix" URLs as well.
 *
 * S3 speaks HTTP through libcurl (libcurl.so.4, which signs requests with AWS Signature Version 4), loaded when the
 * first S3 storage is made, so that libdistckpt.so needs it only where S3 is used; without it, making S3 storage is
 * DCKPT_EUNSUPPORTED naming the library (Debian: apt-get install libcurl4; DCKPT_CURL_LIBRARY names another file).
 * Checkpoints are committed metadata-last (FORMAT.md section 6.2): the metadata is one PUT with If-None-Match: *
 * (or a plain PUT when overwriting), data files larger than one part are multipart uploads streamed part by part as
 * they are written (a failed or discarded file's upload is aborted), reads are ranged GETs (small reads of one file
 * share one GET of a read block), and a request that fails with a network error, HTTP 500/502/503/504, 429 or an S3
 * throttling or timeout code is retried with exponential backoff and jitter, `max_attempts` tries in all. Errors
 * name the URL, the request and S3's error code and message. */
typedef enum dckpt_s3_addressing {
  DCKPT_S3_ADDRESSING_AUTO = 0,   /* path style with a custom endpoint, virtual-hosted on AWS (path style for a bucket
                                     name with dots) */
  DCKPT_S3_ADDRESSING_PATH = 1,   /* <endpoint>/<bucket>/<key> */
  DCKPT_S3_ADDRESSING_VIRTUAL = 2 /* <scheme>://<bucket>.<endpoint host>/<key> */
} dckpt_s3_addressing;
#define DCKPT_S3_OPTIONS_VERSION 1
/* Where and how to reach S3. Every NULL or zero field takes what the AWS CLI reads from the environment, then from
 * the profile (AWS_PROFILE, else "default") of ~/.aws/credentials and ~/.aws/config (capi/API.md, "Storage"), or else
 * the default given. */
typedef struct dckpt_s3_options {
  unsigned version;
  const char *endpoint;          /* "http://127.0.0.1:9000"; NULL: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else
                                    https://s3.<region>.amazonaws.com */
  const char *region;            /* NULL: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1 */
  const char *access_key_id;     /* NULL: AWS_ACCESS_KEY_ID (with neither this nor that, requests go unsigned) */
  const char *secret_access_key; /* NULL: AWS_SECRET_ACCESS_KEY */
  const char *session_token;     /* NULL: AWS_SESSION_TOKEN (sent as x-amz-security-token) */
  int addressing;                /* a dckpt_s3_addressing */
  unsigned max_in_flight;        /* requests running at once; 0: 16 */
  unsigned max_attempts;         /* tries per request, the first included (1: no retry); 0: 6 */
  double request_timeout_seconds; /* a request that moves no byte for this long fails (and is retried); 0: 30 */
  uint64_t part_size;            /* multipart upload part size; 0: 8 MiB; at least 5 MiB */
  uint64_t read_block_size;      /* a read shorter than half of this fetches the aligned block around it, which the
                                    reads that follow share; 0: 4 MiB; 1: every read is its own GET */
} dckpt_s3_options;
#define DCKPT_S3_OPTIONS_INIT {DCKPT_S3_OPTIONS_VERSION, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0.0, 0, 0}
/* Sets `*options` to DCKPT_S3_OPTIONS_INIT with `version` (for bindings, which cannot expand the macro). */
DCKPT_API int dckpt_s3_options_init(dckpt_s3_options *options, unsigned version);
/* Whether `path` is a URL and not a file system path: `*length` is the length of its scheme ("s3" of "s3://b/k": 2),
 * 0 for a plain path. A scheme is a letter followed by letters, digits, '+', '-' or '.', then "://". The one rule the
 * calls taking a URL use, for clients that must tell a URL from a path themselves. */
DCKPT_API int dckpt_url_scheme(size_t *length, const char *path);
/* S3 storage (NULL options: all from the environment). Paths on it are "s3://bucket/key" URLs. */
DCKPT_API int dckpt_storage_new_s3(dckpt_storage **out, const dckpt_s3_options *options);
/* The storage a URL names: "s3://..." S3 from the environment, a plain path (no "scheme://") the POSIX file system;
 * DCKPT_EUNSUPPORTED, naming the scheme, for any other. */
DCKPT_API int dckpt_storage_open_url(dckpt_storage **out, const char *url);
/* Called with each name dckpt_storage_list_dir finds; a non-zero return stops the listing with DCKPT_EUSER. */
typedef int (*dckpt_name_fn)(const char *name, void *user_data);
/* Reports the names directly below `dir` on `storage` (NULL: as the URL or path says), each once, in byte order: files
 * and directories (on an object store, the first component of longer keys). A `dir` with nothing below it has none. */
DCKPT_API int dckpt_storage_list_dir(dckpt_storage *storage, const char *dir, dckpt_name_fn each, void *user_data);
/* Reads the whole file at `path` on `storage` (NULL: as the URL or path says) into `buf`; `*size` is its size. With
 * `buf` NULL or `buf_size` smaller than the file, DCKPT_EBUFSIZE and `*size` is the size needed. For the small files
 * beside checkpoints (an export's index, a run's notes), from any storage. */
DCKPT_API int dckpt_storage_read_file(uint64_t *size, dckpt_storage *storage, const char *path, void *buf,
                                      uint64_t buf_size);

/* What is at a path of a storage (dckpt_storage_stat). */
typedef enum dckpt_path_kind {
  DCKPT_PATH_NONE = 0,       /* nothing, or nothing distckpt wrote */
  DCKPT_PATH_CHECKPOINT = 1, /* a committed checkpoint (its metadata is there; it is not opened or checked here) */
  DCKPT_PATH_INCOMPLETE = 2  /* no checkpoint, only what unfinished saves left: prune's to remove */
} dckpt_path_kind;
#define DCKPT_PATH_INFO_VERSION 1
typedef struct dckpt_path_info {
  unsigned version;
  int kind;               /* a dckpt_path_kind */
  uint64_t files;         /* files distckpt wrote there (committed and leftover) */
  uint64_t bytes;         /* their total size */
  uint64_t leftover_files; /* files no committed checkpoint refers to: unfinished or superseded saves */
  uint64_t leftover_bytes;
  unsigned saves_in_progress; /* unfinished saves whose writer marker is younger than the grace period given */
} dckpt_path_info;
#define DCKPT_PATH_INFO_INIT {DCKPT_PATH_INFO_VERSION, 0, 0, 0, 0, 0, 0}
/* Describes what is at `path` on `storage` (NULL: POSIX) for a checkpoint laid out for storage without rename (any
 * storage from dckpt_storage_new_callbacks or _new_memory). Saves whose marker is younger than `grace_seconds` count
 * as in progress. */
DCKPT_API int dckpt_storage_stat(dckpt_path_info *out, dckpt_storage *storage, const char *path, double grace_seconds);
/* Told each path dckpt_storage_remove_leftovers removes (or, with dry_run, would remove); non-zero stops the removal
 * with DCKPT_EUSER. */
typedef int (*dckpt_removed_fn)(const char *path, void *user_data);
/* Removes the leftovers at `path` (files of abandoned saves: their writer on this host has exited, or, for a writer on
 * another host, their marker is older than `grace_seconds`; a writer of this host that still runs keeps its files
 * however old; and files no committed checkpoint refers to), never the committed checkpoint nor a file distckpt did not write. `removed` (may be
 * NULL) is called with each path removed; a non-zero return stops with DCKPT_EUSER. With dry_run != 0 nothing is
 * removed but `removed` still reports what would be. */
DCKPT_API int dckpt_storage_remove_leftovers(dckpt_storage *storage, const char *path, double grace_seconds,
                                             int dry_run, dckpt_removed_fn removed, void *user_data);
/* Removes the checkpoint at `path` and its leftovers: the metadata first (so it stops existing in one step), then its
 * data files. DCKPT_ENOTFOUND when nothing distckpt wrote is there. */
DCKPT_API int dckpt_storage_remove_checkpoint(dckpt_storage *storage, const char *path);

/* ---- Leftovers beside checkpoints on a file system --------------------------------------------------------------- */

/* What unfinished saves, overwrites and prunes leave beside checkpoints on a file system (FORMAT.md 6.1): directories
 * "<name>.dckpt-staging-<nonce>", "<name>.dckpt-old-<nonce>", "<name>.dckpt-deleting-<nonce>". dckpt_storage_stat and
 * dckpt_storage_remove_leftovers on a POSIX checkpoint path include them; these calls list a whole directory's. */
typedef enum dckpt_leftover_kind {
  DCKPT_LEFTOVER_STAGING = 1,           /* a save in progress, or abandoned */
  DCKPT_LEFTOVER_COMPLETE_UNRENAMED = 2, /* every rank finished, but the save died before its rename (never reported) */
  DCKPT_LEFTOVER_REPLACED = 3,          /* a checkpoint an overwrite moved aside */
  DCKPT_LEFTOVER_DELETING = 4           /* a checkpoint a prune moved aside */
} dckpt_leftover_kind;
/* Whether the writer a staging directory's STAGING marker names is alive (only a process of this host can be asked). */
typedef enum dckpt_writer_state {
  DCKPT_WRITER_UNKNOWN = 0, /* no marker, another host's writer, or the marker does not say */
  DCKPT_WRITER_RUNNING = 1,
  DCKPT_WRITER_EXITED = 2
} dckpt_writer_state;
#define DCKPT_LEFTOVER_INFO_VERSION 1
/* One leftover directory. The strings are valid during the callback only. */
typedef struct dckpt_leftover_info {
  unsigned version;        /* DCKPT_LEFTOVER_INFO_VERSION of the library that filled it */
  const char *path;        /* the directory: the dir given + "/" + name */
  const char *name;        /* its own name */
  const char *final_name;  /* the checkpoint name it belongs to */
  int kind;                /* a dckpt_leftover_kind */
  uint64_t bytes;          /* regular files below it (links not followed) */
  double idle_seconds;     /* since the newest change of the directory or an entry directly in it */
  int writer;              /* a dckpt_writer_state (DCKPT_LEFTOVER_STAGING) */
  int64_t writer_pid;      /* from the marker; -1 if none */
  const char *writer_host; /* from the marker; "" if none */
  const char *writer_started_utc; /* from the marker ("2026-11-26T18:04:31Z"); "" if none */
  int garbage;             /* non-zero: removable under the grace period given (dckpt_remove_leftover) */
  const char *reason;      /* why, in words: "abandoned: writer pid 12 on this host has exited; idle 2h01m" */
} dckpt_leftover_info;
/* Called once per leftover, in name order; a non-zero return stops the scan with DCKPT_EUSER. */
typedef int (*dckpt_leftover_fn)(const dckpt_leftover_info *info, void *user_data);
/* Reports every leftover directly in the directory `dir` (with `final_name` non-NULL and non-empty, only that
 * checkpoint's). Garbage: a staging directory idle for more than `grace_seconds` whose writer is not a live process
 * of this host, and a moved-aside directory idle that long. Symbolic links and other names are never looked into.
 * A missing `dir` has none. */
DCKPT_API int dckpt_scan_leftovers(const char *dir, const char *final_name, double grace_seconds,
                                   dckpt_leftover_fn each, void *user_data);
/* Judges the leftover directory at `path` anew and removes it if it is garbage now, never following a symbolic link
 * (how: capi/API.md, "Storage"). DCKPT_ENOTFOUND if `path` is not a leftover directory; DCKPT_ESTATE, saying why, if it
 * is not garbage (a live writer, within the grace period) or changed while being removed. */
DCKPT_API int dckpt_remove_leftover(const char *path, double grace_seconds);

/* ---- State: what a rank saves, or where it loads to ------------------------------------------------------------ */

/* A set of named entries: tensors made of local pieces, and opaque bytes. Buffers are borrowed, not copied: they must
 * stay valid until the save/load that uses them returns. Not thread-safe. */
typedef struct dckpt_state dckpt_state;

/* Creates an empty state. */
DCKPT_API int dckpt_state_new(dckpt_state **out);
/* Frees `state` (NULL is fine); the buffers it borrowed stay the caller's. */
DCKPT_API void dckpt_state_free(dckpt_state *state);
/* Declares a tensor of `ndim` dimensions (0 for a scalar) with its global shape. */
DCKPT_API int dckpt_state_add_tensor(dckpt_state *state, const char *name, int dtype, size_t ndim,
                                     const uint64_t *shape);
/* Adds a local piece: the box [offsets, offsets + lengths) of the global tensor, held row-major in `data`
 * (volume * dtype size bytes). Save reads it; load fills it. The same box on several ranks is a replica. */
DCKPT_API int dckpt_state_add_piece(dckpt_state *state, const char *name, const uint64_t *offsets,
                                    const uint64_t *lengths, void *data);
/* As dckpt_state_add_piece, for a buffer that is only read: a save takes it; a load of this state fails with
 * DCKPT_EINVAL naming the tensor (it would have to write through a const pointer). */
DCKPT_API int dckpt_state_add_piece_const(dckpt_state *state, const char *name, const uint64_t *offsets,
                                          const uint64_t *lengths, const void *data);
/* Where a piece's buffer lives (dckpt_piece_options.memory). See capi/API.md, "Device memory". */
typedef enum dckpt_memory_kind {
  DCKPT_MEMORY_HOST = 0, /* host memory (pageable or pinned) */
  DCKPT_MEMORY_CUDA = 1  /* CUDA device memory (cudaMalloc, a framework's caching allocator) */
} dckpt_memory_kind;

#define DCKPT_PIECE_OPTIONS_VERSION 1
typedef struct dckpt_piece_options {
  unsigned version;
  int memory;   /* dckpt_memory_kind (default DCKPT_MEMORY_HOST) */
  int device;   /* DCKPT_MEMORY_CUDA: the device ordinal the buffer belongs to (default 0) */
  void *stream; /* DCKPT_MEMORY_CUDA: the CUstream / cudaStream_t the data is ordered on, usually the framework's
                 * current stream (NULL: the legacy default stream). A save waits for the work queued on it at the
                 * time of the save call before copying, without blocking the host; borrowed, must stay valid until
                 * the save (or, for dckpt_save_async, its staging) has returned. */
} dckpt_piece_options;
#define DCKPT_PIECE_OPTIONS_INIT {DCKPT_PIECE_OPTIONS_VERSION, DCKPT_MEMORY_HOST, 0, NULL}
/* dckpt_piece_options.device: the device the buffer is on, asked of the driver (for producers that do not say, such
 * as a __cuda_array_interface__ without a device). Works from a thread with no current CUDA context. */
#define DCKPT_DEVICE_OF_POINTER (-1)
/* dckpt_piece_options.stream: the data is complete, wait for no stream (a __cuda_array_interface__ stream of None: the
 * producer says no synchronisation is needed). Unlike NULL, the legacy default stream, which waits for all of the
 * device's legacy-stream work. */
#define DCKPT_STREAM_READY ((void *)(intptr_t)-1)
/* Sets `*opts` to DCKPT_PIECE_OPTIONS_INIT with `version` (DCKPT_PIECE_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_piece_options_init(dckpt_piece_options *opts, unsigned version);
/* As dckpt_state_add_piece, with the buffer's location: host memory (NULL opts: the same as dckpt_state_add_piece) or
 * CUDA device memory. The CUDA driver (libcuda.so.1) is loaded on the first DCKPT_MEMORY_CUDA piece; without it the
 * call fails with DCKPT_EUNSUPPORTED naming what is missing. A device buffer is checked to be memory of `device`
 * (DCKPT_EINVAL otherwise). A save or load copies after the work queued on `stream`; a load returns once its device
 * copies have completed. How device pieces are staged: capi/API.md, "Device memory". */
DCKPT_API int dckpt_state_add_piece_ex(dckpt_state *state, const char *name, const uint64_t *offsets,
                                       const uint64_t *lengths, void *data, const dckpt_piece_options *opts);
/* Adds a bytes entry. Save: `size` bytes of `data`. Load: `data` receives up to `size` bytes (the capacity); see
 * dckpt_state_bytes_size for the stored size. */
DCKPT_API int dckpt_state_add_bytes(dckpt_state *state, const char *name, void *data, uint64_t size);
/* As dckpt_state_add_bytes, for a buffer that is only read (save only; a load fails with DCKPT_EINVAL). */
DCKPT_API int dckpt_state_add_bytes_const(dckpt_state *state, const char *name, const void *data, uint64_t size);
/* After a load: the stored size of a bytes entry. */
DCKPT_API int dckpt_state_bytes_size(uint64_t *out, const dckpt_state *state, const char *name);
/* Free-form metadata saved with the checkpoint (rank 0's values are stored). */
DCKPT_API int dckpt_state_set_user(dckpt_state *state, const char *key, const char *value);
/* An opaque description bindings use to rebuild nested state (rank 0's value is stored). */
DCKPT_API int dckpt_state_set_structure(dckpt_state *state, const char *data, size_t size);

/* ---- Save ---------------------------------------------------------------------------------------------------- */

#define DCKPT_SAVE_OPTIONS_VERSION 8
typedef struct dckpt_save_options {
  unsigned version;
  unsigned io_threads;          /* 0: default */
  int overwrite;                /* replace an existing checkpoint at the path (default 0); only a checkpoint or
                                   an empty directory is replaced, anything else is DCKPT_EEXISTS */
  int sync;                     /* fsync data, metadata and directories (default 1) */
  uint64_t checksum_block_size; /* 0: default (1 MiB); else a power of two >= 4096 */
  uint64_t timeout_ms;          /* collective timeout; 0: default (10 minutes) */
  /* version >= 2 */
  dckpt_progress_fn progress;   /* bytes this rank has written; NULL: none */
  void *progress_user_data;
  /* version >= 3: device pieces are staged through `staging_buffers` pinned buffers of `staging_buffer_bytes`,
   * allocated once per process and reused by later saves of the same shape (the host memory a save pins never grows
   * with the state) */
  uint64_t staging_buffer_bytes; /* 0: default (16 MiB); rounded down to a multiple of the checksum block size */
  unsigned staging_buffers;      /* 0: default (4); at least 2, so that copying overlaps hashing and writing */
  /* version >= 4 */
  uint64_t max_async_staging_bytes; /* dckpt_save_async: host memory the staging of this process's unfinished async
                                     * saves may hold; a call that would go past it waits (up to timeout_ms, then
                                     * DCKPT_ETIMEOUT) for earlier ones to finish. One save alone may exceed it.
                                     * 0: no cap (default) */
  /* version >= 5 */
  int device_snapshot; /* dckpt_save_async: DCKPT_MEMORY_CUDA pieces are first copied into device memory distckpt
                        * allocates (device to device, at device memory bandwidth) and the call returns once those
                        * copies are done; the background save then copies them to host through the pinned pool.
                        * Costs free device memory the size of the device pieces; a device without that much free
                        * beyond a headroom for training (1/16 of it, at least 512 MiB) has its pieces staged in host
                        * memory instead (dckpt_save_future_snapshot says how much). Freed when the save finishes
                        * (default 0) */
  /* version >= 6 */
  dckpt_storage *storage; /* where the checkpoint is written; NULL: the POSIX file system (default). The save (an
                           * async one too) holds a reference until it finishes */
  /* version >= 7: incremental saves (capi/API.md "Incremental checkpoints") */
  const char *base;    /* an earlier checkpoint, a sibling of `path` (its path, or its directory name): chunks whose
                        * bytes equal the base's (same entry and region, same length and XXH3-128) are not written
                        * again; the checkpoint refers to them where they lie and needs those checkpoints to be read.
                        * Host pieces are compared; device pieces are always written. NULL or "": a self-contained
                        * save (default) */
  unsigned full_every; /* with `base`: the save that would be the full_every-th of its chain (counted from the last
                        * self-contained save) is written whole instead; 0: no bound (default) */
  /* version >= 8: lossless compression (capi/API.md "Compression") */
  int compression;       /* dckpt_compression: DCKPT_COMPRESSION_NONE (default) or DCKPT_COMPRESSION_ZSTD: every
                          * checksum block of a host piece is compressed on its own, its elements' bytes grouped by
                          * position first (2-, 4- and 8-byte dtypes); what does not shrink is stored raw; device
                          * pieces are written raw. The checkpoint is format 3.0 */
  int compression_level; /* 0 (default): zstd's entropy coder alone over the grouped bytes (Huffman, no match
                          * finding: on floats as small as level 1, about 3x faster to write, 4x to read);
                          * -7 to -1 and 1 to 22: zstd's levels with match finding, for data with repeats */
} dckpt_save_options;
#define DCKPT_SAVE_OPTIONS_INIT {DCKPT_SAVE_OPTIONS_VERSION, 0, 0, 1, 0, 0, NULL, NULL, 0, 0, 0, 0, NULL, NULL, 0, 0, 0}

/* How chunks are stored (dckpt_save_options.compression, dckpt_chunk_info.codec). Never renumbered. */
typedef enum dckpt_compression {
  DCKPT_COMPRESSION_NONE = 0,
  DCKPT_COMPRESSION_ZSTD = 1 /* zstd over byte-grouped elements, per checksum block */
} dckpt_compression;
/* Sets `*opts` to DCKPT_SAVE_OPTIONS_INIT with `version` (DCKPT_SAVE_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_save_options_init(dckpt_save_options *opts, unsigned version);

#define DCKPT_SAVE_INFO_VERSION 2
typedef struct dckpt_save_info {
  unsigned version;
  uint32_t num_files;      /* data files in the checkpoint */
  uint32_t num_entries;
  uint64_t bytes_written;  /* by this rank */
  uint64_t total_bytes;    /* data bytes of the whole checkpoint */
  uint64_t metadata_bytes;
  double seconds;          /* wall time of the call on this rank */
  /* version >= 2 */
  uint64_t bytes_reused;   /* of total_bytes, those the checkpoint refers to in its bases (an incremental save) */
} dckpt_save_info;
#define DCKPT_SAVE_INFO_INIT {DCKPT_SAVE_INFO_VERSION, 0, 0, 0, 0, 0, 0.0, 0}

/* Saves `state` to the directory `path`, atomically. Collective over `comm`: every rank calls it with the same path.
 * If any rank fails, every rank returns an error and nothing appears at `path`. `info` may be NULL. On a file system,
 * missing parent directories of `path` are made (mkdir -p, each made durable). */
DCKPT_API int dckpt_save(dckpt_save_info *info, const char *path, const dckpt_state *state, dckpt_comm *comm,
                         const dckpt_save_options *opts);

/* ---- Asynchronous save --------------------------------------------------------------------------------------- */

/* The outcome of dckpt_save_async. Thread-safe. */
typedef struct dckpt_save_future dckpt_save_future;

/* Waits forever in dckpt_save_future_wait. */
#define DCKPT_WAIT_FOREVER UINT64_MAX

/* Like dckpt_save, but returns as soon as every piece and bytes entry of `state` has been copied into buffers
 * distckpt owns (device pieces too: they are copied to host memory before the call returns): the caller may modify
 * or free its buffers (and the state) right away. Planning, writing, hashing
 * and the commit run on a background thread. Collective over `comm`, which belongs to the save until it completes
 * (run no other collective on it meanwhile). */
DCKPT_API int dckpt_save_async(dckpt_save_future **out, const char *path, const dckpt_state *state, dckpt_comm *comm,
                               const dckpt_save_options *opts);
/* Waits up to timeout_ms (0: just look; DCKPT_WAIT_FOREVER: until done). Returns the save's own status once it has
 * finished (and fills `info`, which may be NULL), or DCKPT_ETIMEOUT while it is still running. */
DCKPT_API int dckpt_save_future_wait(dckpt_save_info *info, dckpt_save_future *future, uint64_t timeout_ms);
/* *done = 1 once the save has finished, successfully or not. */
DCKPT_API int dckpt_save_future_test(int *done, const dckpt_save_future *future);
/* Seconds the caller was blocked copying the state, and the bytes copied. */
DCKPT_API int dckpt_save_future_staging(double *seconds, uint64_t *bytes, const dckpt_save_future *future);
/* What device_snapshot did: `snapshot_bytes` of device pieces were snapshotted in device memory, `fallback_bytes` were
 * staged in host memory instead (their device had not that much free beyond the headroom left for training, 1/16 of
 * it and at least 512 MiB, or ran out). Either out pointer may be NULL. */
DCKPT_API int dckpt_save_future_snapshot(uint64_t *snapshot_bytes, uint64_t *fallback_bytes,
                                         const dckpt_save_future *future);
/* Waits for the save to finish if it is still running (it cannot be cancelled midway), then frees the future (NULL
 * is fine). */
DCKPT_API void dckpt_save_future_free(dckpt_save_future *future);

/* ---- Load and read ------------------------------------------------------------------------------------------- */

/* dckpt_read_options.fanout */
typedef enum dckpt_fanout_mode {
  DCKPT_FANOUT_AUTO = 0,  /* only where the ranks do not all read through one page cache (several hosts, plugged-in
                           * storage): there the bytes read from storage drop by the replica factor */
  DCKPT_FANOUT_OFF = 1,   /* every rank reads what it needs itself */
  DCKPT_FANOUT_ALWAYS = 2 /* whenever several ranks need the same bytes */
} dckpt_fanout_mode;

#define DCKPT_READ_OPTIONS_VERSION 7
typedef struct dckpt_read_options {
  unsigned version;
  int verify;          /* check checksums of every byte read (default 1) */
  unsigned io_threads; /* 0: default */
  uint64_t timeout_ms; /* collective timeout; 0: default (10 minutes) */
  /* version >= 2 */
  dckpt_progress_fn progress; /* bytes this rank has read during dckpt_load; NULL: none */
  void *progress_user_data;
  /* version >= 3 */
  int map_files;          /* read data already in the page cache through a read-only mapping (default 1). A data
                           * file truncated in place by another process while mapped raises SIGBUS, as with any
                           * mapped reader; 0: nothing is mapped (reads use pread, a truncation is a clean
                           * DCKPT_ECORRUPT), the mode for files that may be modified under a running reader. */
  int share_verification; /* dckpt_load: ranks on one host that read the same file split the hashing of the checksum
                           * blocks they all need; a mismatch still fails every rank (default 1) */
  /* version >= 4 */
  int pin_files;          /* dckpt_reader_open: open every data file now (default 1), so that the reader keeps
                           * reading the checkpoint it opened whatever happens to the path later. 0: each file on
                           * first use, through the checkpoint directory opened with the metadata (for a reader on
                           * many ranks that each read a few files, as a load does); a checkpoint replaced or removed
                           * meanwhile then fails those reads, it is never mixed with another. */
  /* version >= 5 */
  int fanout;             /* dckpt_load with several ranks: bytes several ranks need (replicas) are read from storage
                           * once, each rank reading a disjoint part, verified by the rank that reads it, and
                           * exchanged over the communicator; a dckpt_fanout_mode (default DCKPT_FANOUT_AUTO). See
                           * capi/API.md, "Fan-out load". */
  uint64_t fanout_round_bytes; /* the most a rank receives per exchange round (bounds the fan-out's memory); 0:
                                * default (256 MiB) */
  /* version >= 6: device destinations (DCKPT_MEMORY_CUDA pieces, dckpt_reader_read_ex) are filled through
   * `staging_buffers` pinned buffers of `staging_buffer_bytes`, the same process-wide pool a save of that shape uses */
  uint64_t staging_buffer_bytes; /* 0: default (16 MiB); rounded down to a multiple of the checksum block size */
  unsigned staging_buffers;      /* 0: default (4); at least 2 */
  /* version >= 7 */
  dckpt_storage *storage; /* where the checkpoint is read from; NULL: the POSIX file system (default). A reader holds
                           * a reference until it is freed */
} dckpt_read_options;
#define DCKPT_READ_OPTIONS_INIT \
  {DCKPT_READ_OPTIONS_VERSION, 1, 0, 0, NULL, NULL, 1, 1, 1, DCKPT_FANOUT_AUTO, 0, 0, 0, NULL}
/* Sets `*opts` to DCKPT_READ_OPTIONS_INIT with `version` (DCKPT_READ_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_read_options_init(dckpt_read_options *opts, unsigned version);

#define DCKPT_IO_STATS_VERSION 4
typedef struct dckpt_io_stats {
  unsigned version;
  uint64_t bytes_read;      /* bytes read from data files with read system calls */
  uint64_t read_calls;      /* read system calls */
  uint64_t bytes_verified;  /* bytes hashed to check checksums (by this rank) */
  uint64_t bytes_delivered; /* bytes copied into caller buffers */
  double seconds;           /* for dckpt_load: wall time of the call */
  /* version >= 2 */
  uint64_t bytes_mapped;    /* bytes delivered straight from the page cache through a mapping (not in bytes_read) */
  /* version >= 3 (fan-out load) */
  uint64_t bytes_received_from_peers; /* bytes this rank needed that other ranks read from storage (in
                                       * bytes_delivered, not in bytes_read) */
  uint64_t bytes_sent_to_peers;       /* bytes this rank read from storage for other ranks (counted once, however
                                       * many ranks need them) */
  /* version >= 4 */
  uint64_t bytes_read_direct; /* of bytes_read, those read past the page cache (O_DIRECT) into the pinned staging
                               * buffers of device destinations (data not in the page cache, where the file system
                               * allows it; DCKPT_DIRECT_IO=0 turns it off) */
} dckpt_io_stats;
#define DCKPT_IO_STATS_INIT {DCKPT_IO_STATS_VERSION, 0, 0, 0, 0, 0.0, 0, 0, 0, 0}

/* Fills every piece and bytes entry of `state` from the checkpoint at `path`, resharding as needed: each rank reads
 * only the bytes its pieces need. Tensors must exist with the same dtype and global shape. Collective over `comm`.
 * `stats` may be NULL. */
DCKPT_API int dckpt_load(dckpt_io_stats *stats, const char *path, dckpt_state *state, dckpt_comm *comm,
                         const dckpt_read_options *opts);

/* An open checkpoint. Thread-safe: several threads may read through one reader at once. It reads only the checkpoint
 * it opened: files inside it are opened relative to its directory and never through a symbolic link (capi/API.md,
 * "What a reader opens"). */
typedef struct dckpt_reader dckpt_reader;

/* Opens a committed checkpoint; the metadata is verified and validated before use. With a communicator the call is
 * collective (rank 0 reads the metadata and broadcasts it). Checkpoints other libraries wrote are read in place, with
 * no conversion: a Hugging Face safetensors directory (an index and its shards, or .safetensors files), one
 * .safetensors file, or a PyTorch DCP directory (capi/API.md, "Foreign checkpoints"); so are dckpt_load's. */
DCKPT_API int dckpt_reader_open(dckpt_reader **out, const char *path, dckpt_comm *comm,
                                const dckpt_read_options *opts);
/* Closes the reader (NULL is fine). What it lent (info strings, mapped chunks) is invalid afterwards; must not race
 * with other calls on it. */
DCKPT_API void dckpt_reader_free(dckpt_reader *reader);
/* Loads `state` as dckpt_load does, from the checkpoint `reader` opened and with the reader's options, without reading
 * its metadata again: a binding that reads the structure or bytes entries through a reader loads the tensors this way,
 * so that everything comes from one checkpoint. Collective over `comm`, which must be the communicator the reader was
 * opened with (NULL for both in a single process). `progress` (may be NULL) reports this rank's bytes. `stats` may be
 * NULL; its counters are the reader's since it was opened. Not to be run concurrently on one reader. */
DCKPT_API int dckpt_reader_load(dckpt_io_stats *stats, dckpt_reader *reader, dckpt_state *state, dckpt_comm *comm,
                                dckpt_progress_fn progress, void *progress_user_data);

#define DCKPT_CHECKPOINT_INFO_VERSION 5
typedef struct dckpt_checkpoint_info {
  unsigned version;
  unsigned format_major;
  unsigned format_minor;
  const char *writer;           /* borrowed; "" when the checkpoint names none (never NULL) */
  size_t num_entries;
  size_t num_files;
  uint64_t total_bytes;         /* data bytes */
  uint64_t metadata_bytes;
  uint64_t checksum_block_size; /* 0 for a foreign checkpoint (no checksums) */
  /* version >= 2 (foreign checkpoints read in place: capi/API.md, "Foreign checkpoints") */
  const char *source;           /* borrowed; "" for a distckpt checkpoint, else the format read in place:
                                 * "safetensors" or "torch-dcp" (never NULL) */
  int checksummed;              /* 1 when every chunk carries checksums (distckpt); 0 for a foreign checkpoint,
                                 * whose bytes cannot be verified (dckpt_reader_verify: DCKPT_EUNSUPPORTED) */
  /* version >= 3 */
  const char *source_version;   /* borrowed; the version a foreign format records of itself, as it records it:
                                 * "1.0.0" for a DCP .metadata that has one; "" for a format that records none
                                 * (safetensors, older DCP) and for a distckpt checkpoint, whose format version is
                                 * format_major.format_minor (never NULL). format_major and format_minor of a
                                 * foreign checkpoint are those of its in-memory description, not the format's. */
  /* version >= 4 (incremental checkpoints, format 2.0) */
  size_t num_bases;             /* earlier checkpoints whose data files this one reads (dckpt_reader_base); 0 for a
                                 * self-contained checkpoint */
  unsigned chain_length;        /* saves since the last self-contained one in its chain (0: it reads no base) */
  uint64_t bytes_in_bases;      /* of total_bytes, those that lie in its bases' data files */
  /* version >= 5 (compression, format 3.0) */
  uint64_t stored_bytes;        /* what the chunks take in data files (its own and its bases'): total_bytes less
                                 * what compression saved */
  size_t compressed_chunks;     /* chunks stored compressed */
} dckpt_checkpoint_info;
#define DCKPT_CHECKPOINT_INFO_INIT {DCKPT_CHECKPOINT_INFO_VERSION, 0, 0, NULL, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}
/* The checkpoint's summary (set out->version first, e.g. with DCKPT_CHECKPOINT_INFO_INIT); `writer` is borrowed. */
DCKPT_API int dckpt_reader_info(dckpt_checkpoint_info *out, const dckpt_reader *reader);
/* The name of base `index` (< num_bases) of an incremental checkpoint: a sibling directory (same parent, or key prefix
 * on an object store) whose data files it reads. `*name` is borrowed from the reader. */
DCKPT_API int dckpt_reader_base(const char **name, const dckpt_reader *reader, size_t index);

#define DCKPT_ENTRY_INFO_VERSION 1
typedef struct dckpt_entry_info {
  unsigned version;
  int kind;                /* dckpt_entry_kind */
  int dtype;               /* dckpt_dtype */
  const char *name;        /* borrowed, NUL-terminated */
  size_t ndim;
  const uint64_t *shape;   /* borrowed; ndim values */
  uint64_t nbytes;
  size_t num_chunks;
} dckpt_entry_info;
#define DCKPT_ENTRY_INFO_INIT {DCKPT_ENTRY_INFO_VERSION, 0, 0, NULL, 0, NULL, 0, 0}
/* Entries are sorted by name; index is 0..num_entries-1. */
DCKPT_API int dckpt_reader_entry(dckpt_entry_info *out, const dckpt_reader *reader, size_t index);
/* DCKPT_ENOTFOUND if there is no such entry. */
DCKPT_API int dckpt_reader_find(size_t *index, const dckpt_reader *reader, const char *name);

#define DCKPT_CHUNK_INFO_VERSION 3
typedef struct dckpt_chunk_info {
  unsigned version;
  size_t ndim;
  const uint64_t *offsets;  /* borrowed; the chunk's box */
  const uint64_t *lengths;
  const char *file;         /* borrowed; data file name inside the checkpoint */
  uint64_t file_offset;
  uint64_t length;          /* bytes */
  uint64_t checksum;        /* see FORMAT.md */
  /* version >= 2 */
  const char *base;         /* borrowed; "" when `file` is the checkpoint's own, else the base checkpoint (a sibling,
                             * dckpt_reader_base) whose data file it is (an incremental checkpoint) */
  /* version >= 3 */
  int codec;                /* dckpt_compression: how the chunk is stored */
  uint64_t stored_length;   /* bytes it takes in `file` from file_offset (== length when stored raw) */
} dckpt_chunk_info;
#define DCKPT_CHUNK_INFO_INIT {DCKPT_CHUNK_INFO_VERSION, 0, NULL, NULL, NULL, 0, 0, 0, NULL, 0, 0}
/* Chunk `chunk` (0..num_chunks-1) of entry `entry` (as in dckpt_reader_entry); set out->version first. The pointers
 * are borrowed from the reader. */
DCKPT_API int dckpt_reader_chunk(dckpt_chunk_info *out, const dckpt_reader *reader, size_t entry, size_t chunk);

/* Zero-copy access to chunk `chunk` of entry `entry` (indices as in dckpt_reader_chunk): *data points at its *size
 * bytes (row-major, little-endian, at a 4 KiB-aligned offset of a read-only mapping of its data file), valid until
 * dckpt_reader_free. Pages are read from storage when first touched. The bytes are NOT verified: call
 * dckpt_reader_verify_chunk first where that matters. The data file is the one the reader pinned when it opened, so an
 * overwrite or a removal of the checkpoint does not change what *data shows. A data file truncated in place by another
 * process while mapped raises SIGBUS on access, as with any mapped reader: open with map_files = 0 where that can
 * happen (this function then returns DCKPT_EUNSUPPORTED, and nothing the reader does can raise SIGBUS).
 * DCKPT_EUNSUPPORTED also where the storage cannot map. A compressed chunk (dckpt_chunk_info.codec) has no bytes to
 * map: *data points at its decoded bytes, read, decoded and verified (as dckpt_reader_read does, by
 * dckpt_read_options.verify) into memory the reader owns, by dckpt_reader_map_all or on the first call here, kept
 * until dckpt_reader_free (its decoded size adds to the resident set); map_files = 0 does not prevent it. */
DCKPT_API int dckpt_reader_map_chunk(const void **data, uint64_t *size, dckpt_reader *reader, size_t entry,
                                     size_t chunk);

/* Reads the box [offsets, offsets + lengths) of tensor `name` into `dst`, row-major; dst_size must be exactly its
 * volume * dtype size. Only the needed bytes are read (rounded out to checksum blocks when verifying). */
DCKPT_API int dckpt_reader_read(dckpt_reader *reader, const char *name, size_t ndim, const uint64_t *offsets,
                                const uint64_t *lengths, void *dst, uint64_t dst_size);
/* As dckpt_reader_read, into memory `dst_opts` describes (NULL: host memory). For DCKPT_MEMORY_CUDA, the bytes are
 * verified before they reach the device, the copies start after the work queued on dst_opts->stream, and they have
 * completed when the call returns (capi/API.md, "Device memory"). Without the CUDA driver: DCKPT_EUNSUPPORTED. */
DCKPT_API int dckpt_reader_read_ex(dckpt_reader *reader, const char *name, size_t ndim, const uint64_t *offsets,
                                   const uint64_t *lengths, void *dst, uint64_t dst_size,
                                   const dckpt_piece_options *dst_opts);
/* Reads a bytes entry into `dst`. *size receives its size; DCKPT_EBUFSIZE (nothing copied) if capacity is too small.
 * Pass dst = NULL and capacity = 0 to query the size. */
DCKPT_API int dckpt_reader_read_bytes(uint64_t *size, dckpt_reader *reader, const char *name, void *dst,
                                      uint64_t capacity);

/* The number of user metadata key/values (dckpt_state_set_user). */
DCKPT_API int dckpt_reader_num_user(size_t *out, const dckpt_reader *reader);
/* Key/value `index` of the user metadata (sorted by key); both borrowed, never NULL (a value the file leaves out is
 * ""). */
DCKPT_API int dckpt_reader_user(const char **key, const char **value, const dckpt_reader *reader, size_t index);
/* DCKPT_ENOTFOUND if the key is absent. */
DCKPT_API int dckpt_reader_user_get(const char **value, const dckpt_reader *reader, const char *key);
/* The structure description saved with dckpt_state_set_structure (borrowed; "" with size 0 when there is none, never
 * NULL). */
DCKPT_API int dckpt_reader_structure(const char **data, size_t *size, const dckpt_reader *reader);

/* Reads and checks every chunk; DCKPT_ECORRUPT names the entry, chunk, file and byte range of the first bad block.
 * DCKPT_EUNSUPPORTED, saying so, for a foreign checkpoint (safetensors, DCP): those formats carry no checksums. */
DCKPT_API int dckpt_reader_verify(dckpt_reader *reader, dckpt_progress_fn progress, void *user_data);
/* Reads and checks one chunk (entry and chunk indices as in dckpt_reader_chunk). Lets a tool check chunks in its
 * own order and in parallel, and report every bad one. */
DCKPT_API int dckpt_reader_verify_chunk(dckpt_reader *reader, size_t entry, size_t chunk);
/* As dckpt_reader_verify_chunk, reporting the chunk's bytes checked so far (every 8 MiB at most, so a large chunk
 * shows progress within it); `progress` may be NULL. */
DCKPT_API int dckpt_reader_verify_chunk_progress(dckpt_reader *reader, size_t entry, size_t chunk,
                                                 dckpt_progress_fn progress, void *user_data);
/* The reader's I/O counters since it was opened. */
DCKPT_API int dckpt_reader_io_stats(dckpt_io_stats *out, const dckpt_reader *reader);

/* ---- Whole-checkpoint loads (inference servers) ------------------------------------------------------------- */

#define DCKPT_MAP_ALL_OPTIONS_VERSION 1
typedef struct dckpt_map_all_options {
  unsigned version;
  const size_t *entries;      /* the entries to load (indices as in dckpt_reader_entry); NULL: every entry */
  size_t num_entries;
  dckpt_progress_fn progress; /* bytes made ready so far, of the total; non-zero aborts (DCKPT_EUSER). NULL: none */
  void *progress_user_data;
} dckpt_map_all_options;
#define DCKPT_MAP_ALL_OPTIONS_INIT {DCKPT_MAP_ALL_OPTIONS_VERSION, NULL, 0, NULL, NULL}
/* Sets `*opts` to DCKPT_MAP_ALL_OPTIONS_INIT with `version` (DCKPT_MAP_ALL_OPTIONS_VERSION, or an older one: then
 * only that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_map_all_options_init(dckpt_map_all_options *opts, unsigned version);

/* Loads every chunk of the entries `opts` lists (all of them with opts NULL) for zero-copy use: each is read into the
 * page cache, mapped into this process and, when the reader verifies (dckpt_read_options.verify, the default), its
 * checksums are checked in place; no byte is copied (how: capi/API.md, "How data is read"). On DCKPT_OK,
 * dckpt_reader_map_chunk of these chunks returns the verified bytes, already resident and mapped (no page fault on
 * first touch), until dckpt_reader_free. A checksum mismatch is DCKPT_ECORRUPT naming the checkpoint, entry, chunk,
 * file and byte range; an I/O error while paging in is DCKPT_EIO naming the file (never SIGBUS). Compressed chunks
 * are read, decoded and verified in the same pass into memory the reader owns (dckpt_reader_map_chunk returns it).
 * DCKPT_EUNSUPPORTED
 * where nothing can be mapped (map_files = 0, storage without mappings): read into buffers with dckpt_reader_load or
 * dckpt_reader_read instead. The resident set grows by the bytes loaded. For loads into caller buffers (host or
 * device), use dckpt_reader_load with a dckpt_state that holds one piece per tensor: the same parallel read-and-verify
 * pipeline, reporting progress the same way. */
DCKPT_API int dckpt_reader_map_all(dckpt_reader *reader, const dckpt_map_all_options *opts);

/* ---- Tools ---------------------------------------------------------------------------------------------------- */

/* One rename rule of dckpt_export_options.rename_rules. Syntax (capi/API.md, "Export to the Hugging Face hub"):
 * `pattern` is an ECMAScript regular expression that must match the WHOLE tensor name; `replacement` is literal text
 * with \1..\9 or \g<N> for groups and \\ for a backslash. An empty (or NULL) replacement drops the tensors the
 * pattern matches. */
typedef struct dckpt_rename_rule {
  const char *pattern;
  const char *replacement;
} dckpt_rename_rule;

#define DCKPT_EXPORT_OPTIONS_VERSION 3
typedef struct dckpt_export_options {
  unsigned version;
  uint64_t max_shard_bytes;   /* largest .safetensors file; 0: 5 GB (10^9 bytes per GB, as Hugging Face counts) */
  const char *prefix;         /* file name prefix; NULL: "model" */
  int verify;                 /* check checksums while reading (default 1) */
  dckpt_progress_fn progress; /* bytes written so far; NULL: none */
  void *progress_user_data;
  /* version >= 2 */
  dckpt_storage *storage;     /* where the checkpoint is read from; NULL: the POSIX file system (default) */
  dckpt_storage *out_storage; /* where the safetensors files are written; NULL: the POSIX file system (default) */
  /* version >= 3 */
  /* tried in order, the first whose pattern matches decides; names no rule matches are kept. Two tensors mapped to
   * one name: DCKPT_EINVAL naming both */
  const dckpt_rename_rule *rename_rules;
  size_t num_rename_rules;
  uint64_t buffer_bytes;      /* tensor bytes this process holds in memory at once, all threads together; 0: 64 MiB */
  unsigned io_threads;        /* files this process writes at once; 0: 1 */
  uint64_t timeout_ms;        /* dckpt_export_safetensors_collective: each collective's limit, which must cover the
                               * slowest rank's writing; 0: 10 minutes */
} dckpt_export_options;
#define DCKPT_EXPORT_OPTIONS_INIT {DCKPT_EXPORT_OPTIONS_VERSION, 0, NULL, 1, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0}
/* Sets `*opts` to DCKPT_EXPORT_OPTIONS_INIT with `version` (DCKPT_EXPORT_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. For bindings, which
 * cannot expand the macro. */
DCKPT_API int dckpt_export_options_init(dckpt_export_options *opts, unsigned version);

/* Writes every tensor of the checkpoint at `ckpt_path` into `out_dir` as safetensors files
 * "<prefix>-00001-of-0000N.safetensors" plus "<prefix>.safetensors.index.json" (a single file is still indexed).
 * User metadata goes into each file's "__metadata__"; bytes entries are not tensors and are skipped. Names are mapped
 * by the rename rules first. Memory stays within buffer_bytes plus the metadata, whatever the checkpoint's size.
 * `out_dir` must exist; existing files of the same names are replaced (an earlier index first, so that no index ever
 * lists a mix). */
DCKPT_API int dckpt_export_safetensors(const char *ckpt_path, const char *out_dir, const dckpt_export_options *opts);

/* As dckpt_export_safetensors, collective over `comm` (NULL: this process alone), for a job that exports at the end
 * of training: every rank calls it with the same arguments, and `out_dir` is one directory every rank sees. The files
 * are split among the ranks, balanced by bytes, and each rank writes its own in parallel; once every rank reports
 * its files durable, rank 0 moves them into place and writes the index. Every rank returns the same status; on
 * failure no index is written (and this export's temporary files are removed). Progress counts this rank's files. */
DCKPT_API int dckpt_export_safetensors_collective(const char *ckpt_path, const char *out_dir, dckpt_comm *comm,
                                                  const dckpt_export_options *opts);

#define DCKPT_FLATTEN_INFO_VERSION 1
typedef struct dckpt_flatten_info {
  unsigned version;
  uint64_t bytes_copied;     /* data bytes read, verified and written: every chunk of the checkpoint */
  uint64_t bytes_from_bases; /* of which the source held in its bases */
  uint32_t num_files;        /* data files of the copy */
} dckpt_flatten_info;
#define DCKPT_FLATTEN_INFO_INIT {DCKPT_FLATTEN_INFO_VERSION, 0, 0, 0}

/* Writes a self-contained copy of the checkpoint at `src` to `dst` (capi/API.md "Incremental checkpoints"): every
 * chunk, wherever it lies (in `src` or the bases it refers to), read, checked against its checksums and written to
 * the copy's own data files; the metadata is src's with no references. Committed atomically, as a save is. `dst` may
 * be `src` itself with `overwrite` = 1: the checkpoint becomes self-contained in place (DCKPT_ESTATE if incremental
 * checkpoints refer to it). `storage` as for dckpt_save (NULL: as the paths say). `info` may be NULL. */
DCKPT_API int dckpt_flatten(dckpt_flatten_info *info, const char *src, const char *dst, int overwrite,
                            dckpt_storage *storage);

/* ---- Checkpoint manager: a checkpoint every step, in tiers ------------------------------------------------------ */

/* One per job and rank. Each step is saved into a node-local tier (one ordinary checkpoint per rank, "part", under
 * local_dir), each rank's part is replicated to `replicas` ranks on other nodes over the communicator, and every
 * persist_every-th step (or one asked for) is persisted in the background as one ordinary checkpoint at
 * "<persistent_path>/step-<step, 10 digits>". dckpt_manager_restore loads the newest step whose every part verifies
 * in some tier (own node, a peer's replica, then persistent storage), on any number of ranks. Not thread-safe: one
 * call at a time per manager. The communicator belongs to the manager until dckpt_manager_free (its collectives run
 * on the manager's background thread): give it one of its own. */
typedef struct dckpt_manager dckpt_manager;

/* dckpt_manager_options.background_priority: the CPU and I/O priority of a manager's background work (its thread and
 * the writer threads of each step), so that it yields to the training loop. Restores keep the caller's. */
typedef enum dckpt_priority {
  DCKPT_PRIORITY_DEFAULT = 0, /* the library's choice: DCKPT_PRIORITY_NORMAL (docs/manager.md, "Background work":
                               * a lower priority was measured to slow a busy host's loop down, never to speed it) */
  DCKPT_PRIORITY_NORMAL = 1,  /* as the thread that made the manager */
  DCKPT_PRIORITY_LOW = 2,     /* nice 19 and I/O priority best-effort 7 */
  DCKPT_PRIORITY_IDLE = 3     /* SCHED_IDLE and the idle I/O class: only CPU and disk time nothing else wants */
} dckpt_priority;

/* dckpt_manager_options.replicas: as many as the job's nodes allow, up to 1 (the default). */
#define DCKPT_REPLICAS_AUTO 0xFFFFFFFFu
#define DCKPT_MANAGER_OPTIONS_VERSION 3
typedef struct dckpt_manager_options {
  unsigned version;
  const char *local_dir;        /* the node-local tier's directory, shared by the ranks of one node; NULL:
                                 * "/dev/shm/distckpt-<job>" (survives a process restart, not a node loss) */
  const char *job;              /* NULL: "default"; names the default local_dir */
  const char *node_id;          /* identifies this rank's node (replicas go to other nodes); NULL: the host name */
  unsigned replicas;            /* copies of each part on other nodes: 0, 1 or 2; DCKPT_REPLICAS_AUTO (the default):
                                 * 1 where the job has other nodes, 0 on one node (the restore report says which).
                                 * More than the job's other nodes: DCKPT_EINVAL before anything is created */
  const char *persistent_path;  /* NULL: no persistent tier; a directory, or a URL (s3://bucket/prefix) */
  dckpt_storage *persistent_storage; /* where persistent_path is; NULL: the POSIX file system, or the URL's storage */
  uint64_t persist_every;       /* persist every step that is a multiple of this; 0: only when asked (default) */
  unsigned keep_local;          /* complete steps kept in the local tier; 0: default (2) */
  unsigned keep_persistent;     /* persisted steps kept; 0: all (default) */
  uint64_t local_budget_bytes;  /* the most this rank's local tier may hold: its parts, the replicas it keeps for
                                 * others and the staging of steps in flight. A save that would go past it waits for
                                 * steps in flight, and the node keeps fewer than keep_local complete steps (as many
                                 * as every rank's budget holds beside one step in flight, at least one);
                                 * DCKPT_EINVAL when one kept step and one in flight do not fit. 0: no cap (default) */
  uint64_t timeout_ms;          /* collective timeout; 0: default (10 minutes) */
  int device_snapshot;          /* as dckpt_save_options.device_snapshot (default 0) */
  uint64_t exchange_round_bytes; /* the most one rank sends to another per exchange round (replication, restore);
                                  * 0: default (64 MiB) */
  /* version >= 2 */
  unsigned threads;             /* writer threads of each step's background work (the part's write and checksums;
                                 * replicating and persisting run on the manager's one thread); 0: default (a quarter
                                 * of the cores, 1 to 4) */
  int background_priority;      /* dckpt_priority of the background work; 0: DCKPT_PRIORITY_DEFAULT */
  /* version >= 3: the persistent tier written smaller (docs/manager.md "Persisting smaller") */
  int persist_compression;      /* dckpt_compression of persisted steps, compressed while they are copied from the
                                 * node-local tier (which stays raw); DCKPT_COMPRESSION_NONE (default) */
  int persist_compression_level; /* as dckpt_save_options.compression_level (default 0) */
  int persist_incremental;      /* non-zero: a persisted step refers to the previous persisted step for every chunk
                                 * whose bytes are equal there (same box and XXH3-128), instead of writing it again;
                                 * keep_persistent keeps every step a kept one refers to (default 0) */
  unsigned persist_full_every;  /* with persist_incremental: every persist_full_every-th persisted step of a chain is
                                 * written whole; 0: no bound (default) */
} dckpt_manager_options;
#define DCKPT_MANAGER_OPTIONS_INIT                                                                             \
  {DCKPT_MANAGER_OPTIONS_VERSION, NULL, NULL, NULL, DCKPT_REPLICAS_AUTO, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, \
   DCKPT_PRIORITY_DEFAULT, DCKPT_COMPRESSION_NONE, 0, 0, 0}
/* Sets `*opts` to DCKPT_MANAGER_OPTIONS_INIT with `version` (DCKPT_MANAGER_OPTIONS_VERSION, or an older one: then only
 * that version's fields are written); DCKPT_EVERSION for a version newer than the library. */
DCKPT_API int dckpt_manager_options_init(dckpt_manager_options *opts, unsigned version);

/* Collective over `comm` (NULL: a single process): the ranks learn each other's nodes. DCKPT_EINVAL when `replicas`
 * cannot be placed on that many other nodes; DCKPT_EUNSUPPORTED for a communicator whose collectives cannot run on a
 * background thread (NCCL's: pass the Gloo communicator it was bootstrapped over). */
DCKPT_API int dckpt_manager_new(dckpt_manager **out, dckpt_comm *comm, const dckpt_manager_options *opts);
/* Waits for the background work (as dckpt_manager_wait, errors lost), then frees (NULL is fine). */
DCKPT_API void dckpt_manager_free(dckpt_manager *manager);

/* Saves `step` (larger than every earlier step): returns once the state is staged (the caller may change its buffers
 * right away); writing the local part, replicating and persisting go on in the background, in step order. Every rank
 * saves the same steps in the same order. `persist` non-zero persists this step whatever persist_every says. An
 * error of earlier background work is returned here (DCKPT_EPEER once the communicator has failed: the job must
 * restart and restore). */
DCKPT_API int dckpt_manager_save(dckpt_manager *manager, uint64_t step, const dckpt_state *state, int persist);
/* Waits up to timeout_ms (DCKPT_WAIT_FOREVER: until done) for every step saved so far to be complete (and persisted
 * where asked); returns the first background error since the last wait, or DCKPT_ETIMEOUT. */
DCKPT_API int dckpt_manager_wait(dckpt_manager *manager, uint64_t timeout_ms);
/* The newest step this rank knows to be complete in the local tier (every part and its replicas durable); *found = 0
 * when there is none. */
DCKPT_API int dckpt_manager_latest_step(uint64_t *step, int *found, const dckpt_manager *manager);

#define DCKPT_MANAGER_COUNTERS_VERSION 2
typedef struct dckpt_manager_counters {
  unsigned version;
  uint64_t steps_saved;         /* steps dckpt_manager_save accepted (each then runs in the background) */
  uint64_t steps_completed;     /* steps made complete by this manager (every part and its replicas durable) */
  uint64_t steps_failed;        /* steps whose background work ended without the step complete */
  uint64_t saves_waited;        /* saves that waited before staging (back-pressure): for the steps in flight (at
                                 * most two) or for local_budget_bytes to free up */
  uint64_t saves_waited_for_budget; /* of saves_waited: the ones that waited for local_budget_bytes */
  double wait_seconds;          /* total time saves spent waiting */
  double max_wait_seconds;      /* the longest wait of one save */
  uint64_t bytes_written;       /* bytes of this rank's own parts of completed steps, written to the local tier */
  uint64_t bytes_replicated;    /* bytes of other ranks' parts this rank received and kept (completed steps) */
  /* version >= 2 */
  uint64_t bytes_persisted;     /* bytes this rank wrote to persistent storage, as stored (compressed), for steps
                                 * persisted; a box several ranks hold is written by one of them */
  uint64_t bytes_persist_reused; /* rank 0: data bytes persisted steps refer to in the previous one (incremental) */
  double persist_seconds;       /* time the background work spent persisting steps (after each step's part was
                                 * written and replicated) */
} dckpt_manager_counters;
#define DCKPT_MANAGER_COUNTERS_INIT {DCKPT_MANAGER_COUNTERS_VERSION, 0, 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0.0}

/* The manager's counters since dckpt_manager_new, into `*out` (whose `version` the caller sets: the fields of that
 * version are written). Unlike the other calls it may run on any thread while another call on the manager is in
 * progress (a monitor reading back-pressure while dckpt_manager_save waits). */
DCKPT_API int dckpt_manager_stats(dckpt_manager_counters *out, const dckpt_manager *manager);

/* dckpt_restore_info.tier */
typedef enum dckpt_tier {
  DCKPT_TIER_NONE = 0,        /* nothing to restore */
  DCKPT_TIER_LOCAL = 1,       /* every part this rank read was on its own node */
  DCKPT_TIER_PEER = 2,        /* some parts came from replicas on other nodes */
  DCKPT_TIER_PERSISTENT = 3   /* the step was loaded from persistent storage */
} dckpt_tier;

#define DCKPT_RESTORE_OPTIONS_VERSION 1
typedef struct dckpt_restore_options {
  unsigned version;
  int fallback;                 /* when the newest complete step cannot be restored from any tier (parts lost), load
                                 * the newest one that can (an older local step, or a persisted one) and say so in the
                                 * report (default 1); 0: DCKPT_ENOTFOUND naming the missing parts */
  int use_persistent;           /* consider persistent storage (default 1) */
} dckpt_restore_options;
#define DCKPT_RESTORE_OPTIONS_INIT {DCKPT_RESTORE_OPTIONS_VERSION, 1, 1}
/* Sets `*opts` to DCKPT_RESTORE_OPTIONS_INIT with `version` (as dckpt_save_options_init). */
DCKPT_API int dckpt_restore_options_init(dckpt_restore_options *opts, unsigned version);

#define DCKPT_RESTORE_INFO_VERSION 2
typedef struct dckpt_restore_info {
  unsigned version;
  int found;                    /* 0: no step anywhere (the state is untouched) */
  uint64_t step;
  int tier;                     /* dckpt_tier: where this rank's bytes came from */
  uint64_t bytes_local;         /* bytes this rank read from its own node's tier */
  uint64_t bytes_from_peers;    /* bytes other nodes sent this rank */
  uint64_t bytes_from_persistent; /* bytes this rank read from persistent storage */
  double seconds;
  /* version >= 2: copies of parts of the restored step that a lost node held, being made again from the tiers that
   * hold them, in the background (dckpt_manager_wait waits for them); the same on every rank */
  unsigned copies_made;
} dckpt_restore_info;
#define DCKPT_RESTORE_INFO_INIT {DCKPT_RESTORE_INFO_VERSION, 0, 0, 0, 0, 0, 0, 0.0, 0}

/* Collective: waits for the background work, then the ranks agree on the newest step whose every part verifies in
 * some tier and fill `state` from it (resharding as dckpt_load does: any number of ranks, any sharding). A part that
 * fails verification in one tier is taken from the next. `info` and `opts` may be NULL. */
DCKPT_API int dckpt_manager_restore(dckpt_restore_info *info, dckpt_manager *manager, dckpt_state *state,
                                    const dckpt_restore_options *opts);
/* ---- Looking at a node's local tier (distckpt tiers) ----------------------------------------------------------- */

/* Called once with a whole text (NUL-terminated, `size` bytes before the NUL); non-zero stops with DCKPT_EUSER. */
typedef int (*dckpt_text_fn)(const char *text, size_t size, void *user_data);
/* Describes the checkpoint manager's local tier at `dir` (on this host's file system) as one JSON document, passed
 * to `out`: each step with its parts and replicas (rank, size, run, state "complete", "in progress", "abandoned" or
 * "damaged" with why), its completion markers, whether this node alone could restore it, whether it is abandoned;
 * schema in docs/manager.md ("Looking at a tier"). Reads only and never follows a symbolic link. DCKPT_ENOTFOUND
 * when `dir` is missing; DCKPT_EINVAL when it is not a manager's tier. */
DCKPT_API int dckpt_tiers_describe(const char *dir, dckpt_text_fn out, void *user_data);
/* Removes what dckpt_tiers_describe calls abandoned at `dir`: staging directories whose writer is gone, and steps
 * with no completion marker and nothing in progress of which the run that wrote them marked a newer step complete;
 * never a step with a marker, nothing in progress, nothing reached through a link, no name the manager does not write. `removed` (may be NULL) is told
 * each path first; non-zero stops with DCKPT_EUSER. dry_run != 0 removes nothing but reports what it would. */
DCKPT_API int dckpt_tiers_prune_abandoned(const char *dir, int dry_run, dckpt_removed_fn removed, void *user_data);

/* What the last restore did, one line per fact (the step chosen and why, which tier served each part, what was
 * skipped and why). Valid until the next call on the manager. */
DCKPT_API const char *dckpt_manager_restore_report(const dckpt_manager *manager);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTCKPT_DISTCKPT_H_ */
