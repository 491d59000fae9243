package distckpt_test

import (
	"errors"
	"fmt"
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
