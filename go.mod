module github.com/prefixd/prefixd

go 1.26.8

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/philhofer/fwd v1.2.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/tinylib/msgp v1.6.5 // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	golang.org/x/mod v0.18.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
	golang.org/x/tools v0.22.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
