// Command distckpt looks after checkpoint stores: list, inspect, verify, measure, compare, prune and export
// distckpt checkpoints. Every command takes --json for scripts; see `distckpt help COMMAND` for its fields.
//
// Exit status (every command):
//
//	0  success (verify: every chunk is intact; diff: the checkpoints are the same)
//	1  verify: corruption found (a bad chunk, or metadata that cannot be read); diff: the checkpoints differ
//	2  usage error
//	3  the command failed (checkpoint missing, metadata unreadable, I/O error, a removal in prune failed)
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	distckpt "distckpt.dev/go"
)

const (
	exitOK      = 0
	exitFound   = 1 // corruption (verify) or differences (diff)
	exitUsage   = 2
	exitFailure = 3
)

type command struct {
	name    string
	args    string
	summary string
	help    string // flags and JSON fields
	run     func(c *ctx, args []string) int
}

// ctx carries a command's output streams and the flags every command shares.
type ctx struct {
	stdout, stderr io.Writer
	json           bool
	cmd            *command
}

func commands() []*command {
	return []*command{lsCommand, inspectCommand, verifyCommand, duCommand, diffCommand, pruneCommand, exportCommand,
		versionCommand}
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
	name := args[0]
	if name == "help" {
		if len(args) > 1 {
			if c := findCommand(args[1]); c != nil {
				commandUsage(stdout, c)
				return exitOK
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
	return c.run(&ctx{stdout: stdout, stderr: stderr, cmd: c}, args[1:])
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: distckpt COMMAND [flags] ARGS...\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-19s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Every command takes --json: one JSON document on stdout, with the fields listed by "distckpt help COMMAND".
Fatal errors in JSON mode print {"error": {"code": CODE, "message": TEXT}} and are repeated on stderr.

exit status: 0 success (verify: intact; diff: same); 1 verify found corruption, or diff found differences;
             2 usage error; 3 the command failed (missing checkpoint, unreadable metadata, I/O error, ...)
`)
}

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
			fmt.Fprintf(c.stderr, "distckpt %s: %v\n\n", c.cmd.name, err)
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
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// usageError reports a bad flag value.
func (c *ctx) usageError(format string, args ...interface{}) int {
	fmt.Fprintf(c.stderr, "distckpt %s: %s\n", c.cmd.name, fmt.Sprintf(format, args...))
	return exitUsage
}

// fail reports a fatal error (on stderr, and as {"error": ...} on stdout in JSON mode) and returns status.
func (c *ctx) fail(status int, err error) int {
	fmt.Fprintf(c.stderr, "distckpt %s: %v\n", c.cmd.name, err)
	if c.json {
		c.writeJSON(map[string]interface{}{"error": errorJSON(err)})
	}
	return status
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
	return &jsonError{Code: "error", Message: err.Error()}
}

func (c *ctx) writeJSON(v interface{}) {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
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
	summary: "print the versions of the CLI's library and C ABI",
	help:    `JSON: {"library": "0.1.0", "header": "0.1.0", "abi": 1}`,
	run: func(c *ctx, args []string) int {
		fs := c.flags()
		if _, st := c.parse(fs, args, 0, 0); st >= 0 {
			return st
		}
		if c.json {
			c.writeJSON(map[string]interface{}{
				"library": distckpt.LibraryVersion(), "header": distckpt.HeaderVersion, "abi": distckpt.ABIVersion,
			})
			return exitOK
		}
		fmt.Fprintf(c.stdout, "distckpt %s (library %s, ABI %d)\n", distckpt.HeaderVersion, distckpt.LibraryVersion(),
			distckpt.ABIVersion)
		return exitOK
	},
}
