//go:build distckpt_nopkgconfig

package distckpt_test

// The documentation's snippets (readme_test.go) find the library the way this test binary does (CGO_CFLAGS and
// CGO_LDFLAGS, which they inherit).
func init() { snippetTags = append(snippetTags, "distckpt_nopkgconfig") }
