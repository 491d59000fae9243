module example.com/ckpt-operator

go 1.19

require distckpt.dev/go v0.0.0

// The distckpt Go module is not published: point the requirement at a checkout's go/ directory. go/run_tests.sh
// rewrites this line to the absolute path of the repository it runs in.
replace distckpt.dev/go => ../../../go
