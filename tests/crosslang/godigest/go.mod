module distckpt.dev/crosslang/godigest

go 1.19

require distckpt.dev/go v0.0.0

replace distckpt.dev/go => ../../../go
