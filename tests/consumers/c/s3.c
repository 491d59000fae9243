/* A C program of a user's own on S3, built like main.c (pkg-config after the sources) and run by run.sh against a
 * moto server on loopback, with the endpoint and credentials in the AWS_* environment as the AWS CLI reads them.
 * Given "s3://bucket/prefix": saves a state there with dckpt_save and no storage (the URL is enough), opens it with
 * dckpt_reader_open and checks every value, lists the prefix's parent and the checkpoint with dckpt_storage_list_dir,
 * checks that a missing checkpoint is DCKPT_ENOTFOUND naming its URL and that another scheme is DCKPT_EUNSUPPORTED
 * naming it, then removes the checkpoint. Exits non-zero on any mismatch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distckpt/distckpt.h>

enum { ROWS = 512, COLS = 1024 }; /* 2 MiB of f32 */

static int fail(const char *what) {
  fprintf(stderr, "s3 consumer: %s failed: %s\n", what, dckpt_error_last());
  return 1;
}

/* Names dckpt_storage_list_dir reports, kept in order. */
typedef struct {
  char names[16][128];
  int n;
} name_list;

static int add_name(const char *name, void *user_data) {
  name_list *l = user_data;
  if (l->n == 16 || strlen(name) >= sizeof l->names[0]) return 1; /* stops the listing: DCKPT_EUSER */
  strcpy(l->names[l->n++], name);
  return 0;
}

static int has(const name_list *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->names[i], name) == 0) return 1;
  return 0;
}

/* Expects `rc` to be `want` with a message that contains `named`. */
static int expect(int rc, int want, const char *named, const char *what) {
  if (rc != want) {
    fprintf(stderr, "s3 consumer: %s returned %s, want %s: %s\n", what, dckpt_status_name(rc), dckpt_status_name(want),
            dckpt_error_last());
    return 1;
  }
  if (strstr(dckpt_error_last(), named) == NULL) {
    fprintf(stderr, "s3 consumer: %s: the message does not name '%s': %s\n", what, named, dckpt_error_last());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2 || strncmp(argv[1], "s3://", 5) != 0 || strrchr(argv[1], '/') <= argv[1] + 5) {
    fprintf(stderr, "usage: %s s3://BUCKET/PREFIX/NAME (endpoint and credentials in AWS_*)\n", argv[0]);
    return 2;
  }
  const char *url = argv[1];
  char parent[1024], missing[1100];
  snprintf(parent, sizeof parent, "%s", url);
  *strrchr(parent, '/') = '\0';
  const char *name = strrchr(url, '/') + 1;
  snprintf(missing, sizeof missing, "%s-missing", url);

  float *w = malloc(sizeof(float) * ROWS * COLS);
  if (w == NULL) return 1;
  for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)(i % 4099) * 0.25f - 500.0f;
  const int64_t ids[4] = {-5, 0, (int64_t)1 << 40, INT64_MAX};
  const char blob[] = "tokenizer: 32000 pieces";

  dckpt_state *s = NULL;
  uint64_t shape[2] = {ROWS, COLS}, origin[2] = {0, 0}, ids_shape[1] = {4}, ids_origin[1] = {0};
  if (dckpt_state_new(&s) != DCKPT_OK) return fail("dckpt_state_new");
  if (dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape) != DCKPT_OK) return fail("add_tensor w");
  if (dckpt_state_add_piece_const(s, "w", origin, shape, w) != DCKPT_OK) return fail("add_piece_const w");
  if (dckpt_state_add_tensor(s, "ids", DCKPT_DTYPE_I64, 1, ids_shape) != DCKPT_OK) return fail("add_tensor ids");
  if (dckpt_state_add_piece_const(s, "ids", ids_origin, ids_shape, ids) != DCKPT_OK) return fail("add_piece ids");
  if (dckpt_state_add_bytes_const(s, "tokenizer", blob, sizeof blob) != DCKPT_OK) return fail("add_bytes_const");
  if (dckpt_state_set_user(s, "step", "100") != DCKPT_OK) return fail("set_user");
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  opts.overwrite = 1;
  if (dckpt_save(NULL, url, s, NULL, &opts) != DCKPT_OK) return fail("dckpt_save to S3");
  dckpt_state_free(s);

  /* Every value back through a reader on the URL. */
  dckpt_reader *r = NULL;
  if (dckpt_reader_open(&r, url, NULL, NULL) != DCKPT_OK) return fail("dckpt_reader_open");
  float *got = malloc(sizeof(float) * ROWS * COLS);
  int64_t got_ids[4] = {0};
  char got_blob[64] = {0};
  uint64_t blob_size = 0;
  const char *step = NULL;
  if (got == NULL) return 1;
  if (dckpt_reader_read(r, "w", 2, origin, shape, got, sizeof(float) * ROWS * COLS) != DCKPT_OK) return fail("read w");
  if (dckpt_reader_read(r, "ids", 1, ids_origin, ids_shape, got_ids, sizeof got_ids) != DCKPT_OK)
    return fail("read ids");
  if (dckpt_reader_read_bytes(&blob_size, r, "tokenizer", got_blob, sizeof got_blob) != DCKPT_OK)
    return fail("read tokenizer");
  if (dckpt_reader_user_get(&step, r, "step") != DCKPT_OK) return fail("user_get step");
  if (memcmp(got, w, sizeof(float) * ROWS * COLS) != 0 || memcmp(got_ids, ids, sizeof ids) != 0 ||
      blob_size != sizeof blob || memcmp(got_blob, blob, sizeof blob) != 0 || strcmp(step, "100") != 0) {
    fprintf(stderr, "s3 consumer: the values read back differ from those saved\n");
    return 1;
  }
  if (dckpt_reader_verify(r, NULL, NULL) != DCKPT_OK) return fail("dckpt_reader_verify");
  dckpt_reader_free(r);
  free(got);
  free(w);

  /* Listing: the checkpoint below its parent, its metadata below it. */
  name_list names = {.n = 0};
  if (dckpt_storage_list_dir(NULL, parent, add_name, &names) != DCKPT_OK) return fail("listing the parent");
  if (!has(&names, name)) {
    fprintf(stderr, "s3 consumer: listing %s does not show %s (%d names)\n", parent, name, names.n);
    return 1;
  }
  names.n = 0;
  if (dckpt_storage_list_dir(NULL, url, add_name, &names) != DCKPT_OK) return fail("listing the checkpoint");
  if (!has(&names, "metadata.dckpt")) {
    fprintf(stderr, "s3 consumer: listing %s does not show metadata.dckpt (%d names)\n", url, names.n);
    return 1;
  }
  dckpt_path_info info = DCKPT_PATH_INFO_INIT;
  if (dckpt_storage_stat(&info, NULL, url, 3600.0) != DCKPT_OK) return fail("dckpt_storage_stat");
  if (info.kind != DCKPT_PATH_CHECKPOINT || info.leftover_files != 0) {
    fprintf(stderr, "s3 consumer: stat says kind %d with %llu leftover files\n", info.kind,
            (unsigned long long)info.leftover_files);
    return 1;
  }

  /* Errors name what they are about. */
  if (expect(dckpt_reader_open(&r, missing, NULL, NULL), DCKPT_ENOTFOUND, missing, "opening a missing checkpoint"))
    return 1;
  dckpt_storage *st = NULL;
  if (expect(dckpt_storage_open_url(&st, "gs://x"), DCKPT_EUNSUPPORTED, "gs", "dckpt_storage_open_url(\"gs://x\")"))
    return 1;
  if (expect(dckpt_reader_open(&r, "gs://x/ckpt", NULL, NULL), DCKPT_EUNSUPPORTED, "gs", "opening gs://x/ckpt"))
    return 1;

  /* The same checkpoint through a storage handle made from the URL, then removed. */
  if (dckpt_storage_open_url(&st, url) != DCKPT_OK) return fail("dckpt_storage_open_url");
  if (dckpt_storage_remove_checkpoint(st, url) != DCKPT_OK) return fail("dckpt_storage_remove_checkpoint");
  names.n = 0;
  if (dckpt_storage_list_dir(st, parent, add_name, &names) != DCKPT_OK) return fail("listing after removal");
  if (has(&names, name)) {
    fprintf(stderr, "s3 consumer: %s is still listed after its removal\n", name);
    return 1;
  }
  dckpt_storage_free(st);
  printf("s3 consumer: saved to %s, read back every value, listed, removed\n", url);
  return 0;
}
