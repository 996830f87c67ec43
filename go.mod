module github.com/prefixd/prefixd

go 1.26.8

require (
	github.com/spf13/cobra v1.10.2
	github.com/tinylib/msgp v1.6.5
	github.com/zeebo/xxh3 v1.1.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/philhofer/fwd v1.2.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
