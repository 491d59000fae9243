module distckpt.dev/go

go 1.19
