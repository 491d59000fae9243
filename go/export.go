package distckpt

/*
#include <stdlib.h>
#include <distckpt/distckpt.h>

// Weak, so that this package still links against a libdistckpt built before the exporter existed; calling it then
// reports ErrUnsupported instead of failing to load.
#pragma weak dckpt_export_safetensors
#pragma weak dckpt_export_options_init

static int distckpt_go_has_exporter(void) {
  return dckpt_export_safetensors != NULL && dckpt_export_options_init != NULL;
}
*/
import "C"

import "unsafe"

// RenameRule maps tensor names on export (dckpt_rename_rule; the syntax is capi/API.md's, "Export to the Hugging
// Face hub"): Pattern is an ECMAScript regular expression that must match the whole name; Replacement is literal
// text with \1..\9 or \g<N> for groups and \\ for a backslash. An empty Replacement leaves the matching tensors
// out. The C++ core compiles, checks and applies the rules; nothing is renamed in Go.
type RenameRule struct {
	Pattern, Replacement string
}

// ExportOptions configures ExportSafetensors. The zero value (or nil) means the defaults.
type ExportOptions struct {
	MaxShardBytes uint64         // largest .safetensors file; 0: 5 GB
	Prefix        string         // file name prefix; "": "model"
	NoVerify      bool           // skip checksum verification while reading
	Progress      ProgressFunc   // bytes written so far
	Storage       *StorageHandle // where the checkpoint is read from (nil: the one its path or URL names)
	OutStorage    *StorageHandle // where the safetensors files are written (nil: the one outDir names)
	Rename        []RenameRule   // tried in order, the first whose pattern matches decides; unmatched names are kept
	BufferBytes   uint64         // tensor bytes held in memory at once; 0: 64 MiB
	IOThreads     int            // files written at once; 0: 1
}

// ExportSafetensors writes every tensor of the checkpoint at ckptPath into the existing directory outDir as
// "<prefix>-00001-of-0000N.safetensors" files plus "<prefix>.safetensors.index.json", through the C++ core's
// exporter (dckpt_export_safetensors). Bytes entries are skipped; user metadata goes into each file's
// "__metadata__". Names are mapped by opts.Rename first. Memory stays within opts.BufferBytes plus the metadata.
// ErrUnsupported if the loaded library has no exporter.
func ExportSafetensors(ckptPath, outDir string, opts *ExportOptions) error {
	if C.distckpt_go_has_exporter() == 0 {
		return errorf(CodeUnsupported, "the loaded libdistckpt %s has no dckpt_export_safetensors; upgrade it",
			LibraryVersion())
	}
	var copts C.dckpt_export_options
	if err := ccall(func() C.int { return C.dckpt_export_options_init(&copts, C.DCKPT_EXPORT_OPTIONS_VERSION) }); err != nil {
		return err
	}
	var hook *progressHook
	var in, out *StorageHandle
	if opts != nil {
		in, out = opts.Storage, opts.OutStorage
		inPtr, err := in.acquire()
		if err != nil {
			return err
		}
		defer in.release()
		outPtr, err := out.acquire()
		if err != nil {
			return err
		}
		defer out.release()
		copts.storage, copts.out_storage = inPtr, outPtr
		copts.max_shard_bytes = C.uint64_t(opts.MaxShardBytes)
		if opts.Prefix != "" {
			copts.prefix = C.CString(opts.Prefix)
			defer C.free(unsafe.Pointer(copts.prefix))
		}
		if opts.NoVerify {
			copts.verify = 0
		}
		if opts.IOThreads < 0 {
			return errorf(CodeInvalid, "ExportOptions.IOThreads must be >= 0, not %d", opts.IOThreads)
		}
		copts.buffer_bytes = C.uint64_t(opts.BufferBytes)
		copts.io_threads = C.unsigned(opts.IOThreads)
		if n := len(opts.Rename); n > 0 {
			// C memory: cgo forbids passing Go memory that holds Go pointers.
			rules := (*[1 << 20]C.dckpt_rename_rule)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.dckpt_rename_rule{}))))[:n:n]
			defer C.free(unsafe.Pointer(&rules[0]))
			for i, r := range opts.Rename {
				rules[i].pattern = C.CString(r.Pattern)
				rules[i].replacement = C.CString(r.Replacement)
				defer C.free(unsafe.Pointer(rules[i].pattern))
				defer C.free(unsafe.Pointer(rules[i].replacement))
			}
			copts.rename_rules = &rules[0]
			copts.num_rename_rules = C.size_t(n)
		}
		hook = newProgressHook(opts.Progress)
		copts.progress = hook.cfn()
		copts.progress_user_data = hook.userData()
	}
	cckpt, cout := C.CString(ckptPath), C.CString(outDir)
	defer C.free(unsafe.Pointer(cckpt))
	defer C.free(unsafe.Pointer(cout))
	err := hook.finish(ccall(func() C.int { return C.dckpt_export_safetensors(cckpt, cout, &copts) }))
	return out.explain(in.explain(err))
}
