//go:build distckpt_static

package distckpt_test

// The documentation's snippets (readme_test.go) link the library the way this test binary does.
func init() { snippetTags = append(snippetTags, "distckpt_static") }
