// Package testhooks holds the seams that the tests of the store package and of the CLI replace to make file system
// operations fail or race at chosen moments. Production code only ever calls through them.
package testhooks

import "os"

// RemoveAll removes a directory tree that Prune has decided to delete (os.RemoveAll, which never follows symbolic
// links inside the tree).
var RemoveAll = os.RemoveAll
