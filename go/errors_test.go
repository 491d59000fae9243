package distckpt_test

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"strings"
	"sync"
	"testing"

	distckpt "distckpt.dev/go"
)

func TestErrorsIsMatchesByCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", &distckpt.Error{Code: distckpt.CodeCorrupt, Message: "entry 'w' is bad"})
	if !errors.Is(err, distckpt.ErrCorrupt) || errors.Is(err, distckpt.ErrIO) {
		t.Fatal("errors.Is does not match by code")
	}
	var e *distckpt.Error
	if !errors.As(err, &e) || e.Code != distckpt.CodeCorrupt {
		t.Fatal("errors.As")
	}
	if got := e.Error(); got != "corrupt: entry 'w' is bad" {
		t.Fatalf("Error() = %q", got)
	}
}

func TestCodesHaveLibraryNames(t *testing.T) {
	for code, name := range map[distckpt.Code]string{
		distckpt.CodeCorrupt: "corrupt", distckpt.CodeNotFound: "not found", distckpt.CodeOK: "ok",
	} {
		if code.String() != name {
			t.Errorf("%d: %q, want %q", int(code), code.String(), name)
		}
	}
}

func TestVersions(t *testing.T) {
	if distckpt.ABIVersion != 1 || distckpt.LibraryVersion() == "" || distckpt.HeaderVersion == "" {
		t.Fatalf("ABI %d, library %q, header %q", distckpt.ABIVersion, distckpt.LibraryVersion(), distckpt.HeaderVersion)
	}
}

// The C message is per OS thread: each goroutine must get the message of its own failed call.
func TestErrorMessagesStayWithTheirCall(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				path := fmt.Sprintf("%s/missing-%d-%d", dir, g, i)
				_, err := distckpt.Open(path, nil)
				if !errors.Is(err, distckpt.ErrNotFound) || !strings.Contains(err.Error(), path+"'") {
					t.Errorf("Open(%s): %v", path, err)
					return
				}
				runtime.Gosched()
			}
		}(g)
	}
	wg.Wait()
}

// The library's errors match the io/fs sentinels too, so code that handles file system errors handles them alike.
func TestErrorsIsMatchesFsSentinels(t *testing.T) {
	missing := t.TempDir() + "/missing"
	_, err := distckpt.Open(missing, nil)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrExist) {
		t.Fatalf("Open(missing): %v", err)
	}
	perm := &distckpt.Error{Code: distckpt.CodeIO, Message: "opening 'x/metadata.dckpt' for reading: Permission denied"}
	if !errors.Is(fmt.Errorf("w: %w", perm), fs.ErrPermission) || errors.Is(perm, fs.ErrNotExist) {
		t.Fatal("a permission error is not fs.ErrPermission")
	}
	if errors.Is(&distckpt.Error{Code: distckpt.CodeIO, Message: "read: Input/output error"}, fs.ErrPermission) ||
		!errors.Is(&distckpt.Error{Code: distckpt.CodeExists}, fs.ErrExist) {
		t.Fatal("fs sentinels match the wrong codes")
	}
}
