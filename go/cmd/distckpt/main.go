// Command distckpt looks after checkpoint stores: list, inspect, verify, measure, compare, prune, export and
// consolidate distckpt checkpoints. ls, inspect, du and diff also read checkpoints other libraries wrote, in place
// (Hugging Face safetensors directories and files; reader.go's Open). Every command takes --json for scripts; see `distckpt help COMMAND` for its
// fields. The store operations (ls, prune) are the library's: package distckpt.dev/go/store.
//
// Exit status, the same for a given failure whatever the command (exitStatus maps an error to it):
//
//	0  success (verify: every chunk is intact; diff: the checkpoints are the same)
//	1  the data are not what they should be: verify found a bad chunk (checksum mismatch, truncated or missing data
//	   file), export-safetensors or diff met one while reading; diff: the checkpoints differ
//	2  usage error (unknown command or flag, wrong arguments, bad flag value, a URL of a scheme other than s3://)
//	3  failed for another reason (I/O error, out of memory, a removal in prune that failed, ...); verify: the
//	   checkpoint was written by another library (safetensors, DCP) whose format carries no checksums
//	4  not found: a checkpoint or directory that does not exist, is not a directory (nor a .safetensors or index
//	   file), is not a checkpoint (no metadata.dckpt, and no safetensors or DCP files), or is an uncommitted staging
//	   directory; inspect --layout NAME: no entry NAME
//	5  corrupt metadata: metadata.dckpt is damaged, truncated, or not a distckpt metadata file (or a safetensors
//	   header or index the library rejects)
//	6  unsupported format version: the checkpoint was written by a newer distckpt
//	7  permission denied
//
// ls and prune report a damaged checkpoint in their listing (status "corrupt" or "unreadable") and go on: it is not a
// failure of theirs. The message of every failure names the path involved.
//
// Every checkpoint or store argument may be an "s3://bucket/prefix" URL as well as a path: the library resolves it
// (S3 configured from the AWS_* environment), and package store lists and prunes below it. Output files and
// directories (export-safetensors' OUT, consolidate's OUT.safetensors) are local paths.
//
// JSON output: every document has a top-level "schema_version" (jsonSchemaVersion). It is bumped when a field is
// removed or renamed, or its type or meaning changes; new fields and new values of enumerations (a new ls status)
// may appear without a bump, and readers should ignore what they do not know.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	distckpt "distckpt.dev/go"
)

const (
	exitOK         = 0
	exitFound      = 1 // bad chunks (verify, export, diff's data reads) or differences (diff)
	exitUsage      = 2
	exitFailure    = 3
	exitNotFound   = 4
	exitCorrupt    = 5 // metadata
	exitVersion    = 6
	exitPermission = 7
)

// jsonSchemaVersion is the "schema_version" of every --json document (see the package comment for what bumps it).
const jsonSchemaVersion = 1

// exitStatus is the exit status for a failure (see the table in the package comment). A *distckpt.Error of code
// CodeCorrupt counts as corrupt metadata here; the commands that read data map a corrupt chunk to exitFound
// themselves (dataExitStatus).
func exitStatus(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, fs.ErrPermission):
		return exitPermission
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return exitNotFound
	case errors.Is(err, distckpt.ErrCorrupt):
		return exitCorrupt
	case errors.Is(err, distckpt.ErrVersion):
		return exitVersion
	}
	return exitFailure
}

// dataExitStatus is exitStatus for a failure while reading data of a checkpoint whose metadata opened: a corrupt
// chunk, or a data file that is missing, means damaged data (exitFound).
func dataExitStatus(err error) int {
	if errors.Is(err, distckpt.ErrCorrupt) || errors.Is(err, distckpt.ErrNotFound) {
		return exitFound
	}
	return exitStatus(err)
}

type command struct {
	name    string
	aliases []string // other names it answers to (the other CLI's spelling: docs/cli.md)
	args    string
	summary string
	help    string // flags and JSON fields
	run     func(c *ctx, args []string) int
}

// ctx carries a command's output streams and the flags every command shares.
type ctx struct {
	stdout, stderr io.Writer
	json           bool
	quiet          bool // a leading -q/--quiet (python -m distckpt's spelling): no progress report
	cmd            *command
}

func commands() []*command {
	return []*command{lsCommand, inspectCommand, verifyCommand, duCommand, diffCommand, pruneCommand, exportCommand,
		consolidateCommand, flattenCommand, tiersCommand, versionCommand}
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the whole CLI: it parses args, runs one command writing to stdout and stderr, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	quiet := false
	if (args[0] == "-q" || args[0] == "--quiet") && len(args) > 1 {
		quiet, args = true, args[1:]
	}
	name := args[0]
	if name == "--version" || name == "-version" || name == "-V" {
		name = versionCommand.name
	}
	if name == "help" {
		if len(args) > 1 {
			if c := findCommand(args[1]); c != nil {
				// The command prints its usage and flags for --help.
				return c.run(&ctx{stdout: stdout, stderr: stderr, cmd: c}, []string{"--help"})
			}
		}
		usage(stdout)
		return exitOK
	}
	c := findCommand(name)
	if c == nil {
		fmt.Fprintf(stderr, "distckpt: unknown command %q\n\n", name)
		usage(stderr)
		return exitUsage
	}
	return c.run(&ctx{stdout: stdout, stderr: stderr, quiet: quiet, cmd: c}, args[1:])
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
		for _, a := range c.aliases {
			if a == name {
				return c
			}
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: distckpt [-q] COMMAND [flags] ARGS...\n\ncommands:\n")
	for _, c := range commands() {
		also := ""
		if len(c.aliases) > 0 {
			also = " (also: " + strings.Join(c.aliases, ", ") + ")"
		}
		fmt.Fprintf(w, "  %-19s %s%s\n", c.name, c.summary, also)
	}
	fmt.Fprint(w, `
Every command takes --json: one JSON document on stdout, with the fields listed by "distckpt help COMMAND" and a
top-level "schema_version" (now 1; bumped only when a field is removed, renamed or changes meaning). Fatal errors in
JSON mode print {"schema_version": 1, "error": {"code": CODE, "message": TEXT}} and are repeated on stderr.
Every CKPT and DIR may be an s3://bucket/prefix URL (S3 configured from the AWS_* environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL); OUT is a local path.
A CKPT may also be a checkpoint another library wrote, read in place (`+foreignFormatsHelp+`; inspect shows the format;
it has no checksums, so verify has nothing to check: exit 3).
"distckpt --version" (or -V) is "distckpt version". -q (or --quiet) before COMMAND is --progress=none.
"python -m distckpt" shares inspect (its "info"), export-safetensors and consolidate with the same names, flags,
exit statuses and JSON: see docs/cli.md.

exit status (the same for a given failure in every command):
  0  success (verify: intact; diff: same)
  1  bad data: verify found a bad chunk (or export/diff met one); diff: the checkpoints differ
  2  usage error (a URL of a scheme other than s3:// too)
  3  failed for another reason (I/O error, a removal that failed, ...; verify: a safetensors or DCP
     checkpoint, whose format carries no checksums)
  4  not found (missing, not a directory, not a checkpoint, uncommitted staging directory, no such entry)
  5  corrupt metadata
  6  unsupported format version (written by a newer distckpt)
  7  permission denied
`)
}

// foreignFormatsHelp names the formats of other libraries the CLI reads in place (python -m distckpt --help names
// the same ones).
const foreignFormatsHelp = `a Hugging Face safetensors directory (an index and
its shards, or .safetensors files), one .safetensors file or *.safetensors.index.json, a Hugging Face hub cache
snapshot (models--ORG--NAME/snapshots/REV) or repository (models--ORG--NAME: its refs/main), or a PyTorch DCP
directory (.metadata and .distcp files)`

func commandUsage(w io.Writer, c *command) {
	fmt.Fprintf(w, "usage: distckpt %s %s\n\n%s\n", c.name, c.args, c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
}

// flags returns a FlagSet for the command with the shared --json flag.
func (c *ctx) flags() *flag.FlagSet {
	fs := flag.NewFlagSet(c.cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&c.json, "json", false, "print one JSON document on stdout")
	return fs
}

// singleDashFlag finds the "-name" forms the flag package writes into its error messages.
var singleDashFlag = regexp.MustCompile(`(^|[ :])-([a-zA-Z][a-zA-Z0-9-]*)`)

// parse accepts flags before, between and after the positional arguments (`prune DIR --keep-last 3`), and checks
// their number. It returns -1 to go on, or the exit status.
func (c *ctx) parse(fs *flag.FlagSet, args []string, minPos, maxPos int) ([]string, int) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printHelp(fs, c.stdout)
				return nil, exitOK
			}
			msg := singleDashFlag.ReplaceAllString(err.Error(), "$1--$2")
			fmt.Fprintf(c.stderr, "distckpt %s: %s\n\n", c.cmd.name, msg)
			c.printHelp(fs, c.stderr)
			return nil, exitUsage
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) < minPos || len(pos) > maxPos {
		fmt.Fprintf(c.stderr, "distckpt %s: wrong number of arguments\n\n", c.cmd.name)
		c.printHelp(fs, c.stderr)
		return nil, exitUsage
	}
	return pos, -1
}

func (c *ctx) printHelp(fs *flag.FlagSet, w io.Writer) {
	commandUsage(w, c.cmd)
	fmt.Fprintf(w, "\nflags:\n")
	printFlags(w, fs)
}

// printFlags lists the flags in their --name form (flag.PrintDefaults writes -name, which the usage lines do not use).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		switch f.DefValue {
		case "", "0", "false", "0s":
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n      %s\n", line, usage)
	})
}

// usageError reports a bad flag value.
func (c *ctx) usageError(format string, args ...interface{}) int {
	fmt.Fprintf(c.stderr, "distckpt %s: %s\n", c.cmd.name, fmt.Sprintf(format, args...))
	return exitUsage
}

// fail reports a fatal error with the exit status of its kind (argStatus); see failWith.
func (c *ctx) fail(err error, paths ...string) int {
	return c.failWith(argStatus(err, paths...), err, paths...)
}

// servedScheme is the one URL scheme the library serves (s3://bucket/prefix); any other is a bad argument.
const servedScheme = "s3://"

// argStatus is exitStatus for a failure on the paths given, where a URL of a scheme the library cannot serve
// ("gs://...": the library's unsupported error names the scheme) is a usage error.
func argStatus(err error, paths ...string) int {
	if errors.Is(err, distckpt.ErrUnsupported) {
		for _, p := range paths {
			if distckpt.IsURL(p) && !strings.HasPrefix(p, servedScheme) {
				return exitUsage
			}
		}
	}
	return exitStatus(err)
}

// failWith reports a fatal error (on stderr, and as {"error": ...} on stdout in JSON mode) and returns status.
func (c *ctx) failWith(status int, err error, paths ...string) int {
	je := c.report(err, paths...)
	if c.json {
		c.writeJSON(map[string]interface{}{"error": je})
	}
	return status
}

// report prints a fatal error on stderr and returns its JSON form. The message names the path: when the error's text
// names none of paths, it is prefixed with the first.
func (c *ctx) report(err error, paths ...string) *jsonError {
	je := errorJSON(err)
	msg := err.Error()
	if len(paths) > 0 && !mentionsAny(msg, paths) {
		msg = paths[0] + ": " + msg
		je.Message = paths[0] + ": " + je.Message
	}
	fmt.Fprintf(c.stderr, "distckpt %s: %s\n", c.cmd.name, msg)
	return je
}

func mentionsAny(msg string, paths []string) bool {
	for _, p := range paths {
		if strings.Contains(msg, p) || strings.Contains(msg, filepath.Clean(p)) {
			return true
		}
	}
	return false
}

// jsonError is the JSON form of an error: the library's code name ("corrupt", "not found", ...) and the message.
type jsonError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func errorJSON(err error) *jsonError {
	if err == nil {
		return nil
	}
	var e *distckpt.Error
	if errors.As(err, &e) {
		return &jsonError{Code: e.Code.String(), Message: e.Message}
	}
	code := "error"
	switch exitStatus(err) {
	case exitNotFound:
		code = distckpt.CodeNotFound.String()
	case exitPermission:
		code = "permission denied"
	}
	return &jsonError{Code: code, Message: err.Error()}
}

// writeJSON prints v, a struct or map that becomes a JSON object, with "schema_version" first.
func (c *ctx) writeJSON(v interface{}) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(c.stderr, "distckpt %s: encoding JSON: %v\n", c.cmd.name, err)
		return
	}
	body := bytes.TrimSpace(buf.Bytes())
	doc := []byte(fmt.Sprintf(`{"schema_version":%d`, jsonSchemaVersion))
	if len(body) > 2 && body[0] == '{' {
		doc = append(append(doc, ','), body[1:]...)
	} else {
		doc = append(doc, '}')
	}
	var out bytes.Buffer
	if err := json.Indent(&out, doc, "", "  "); err != nil {
		fmt.Fprintf(c.stderr, "distckpt %s: encoding JSON: %v\n", c.cmd.name, err)
		return
	}
	out.WriteByte('\n')
	_, _ = c.stdout.Write(out.Bytes())
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var versionCommand = &command{
	name:    "version",
	args:    "[--json]",
	summary: "print the versions of the CLI, of its library and of the C ABI (also: distckpt --version, -V)",
	help: `JSON: {"schema_version": 1, "cli": "0.1.0", "library": "0.1.0", "header": "0.1.0", "abi": 1}
"cli" and "header" are the version of the distckpt.h the CLI was built against; "library" is the loaded
libdistckpt's.`,
	run: func(c *ctx, args []string) int {
		fs := c.flags()
		if _, st := c.parse(fs, args, 0, 0); st >= 0 {
			return st
		}
		if c.json {
			c.writeJSON(struct {
				CLI     string `json:"cli"`
				Library string `json:"library"`
				Header  string `json:"header"`
				ABI     int    `json:"abi"`
			}{distckpt.HeaderVersion, distckpt.LibraryVersion(), distckpt.HeaderVersion, distckpt.ABIVersion})
			return exitOK
		}
		fmt.Fprintf(c.stdout, "distckpt %s (library %s, ABI %d)\n", distckpt.HeaderVersion, distckpt.LibraryVersion(),
			distckpt.ABIVersion)
		return exitOK
	},
}
