// Package testhooks holds the seams that the tests of the store package and of the CLI replace to make file system
// operations fail or race at chosen moments. Production code only ever calls through them.
package testhooks

import (
	"os"

	distckpt "distckpt.dev/go"
)

// RemoveAll removes a directory tree that Prune has decided to delete (os.RemoveAll, which never follows symbolic
// links inside the tree).
var RemoveAll = os.RemoveAll

// RemoveLeftover has the library judge a leftover directory anew and remove it (distckpt.RemoveLeftover).
var RemoveLeftover = distckpt.RemoveLeftover
