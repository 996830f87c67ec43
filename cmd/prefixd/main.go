// Command prefixd is the KV-cache-aware routing daemon. This package holds
// only the cobra command tree: each subcommand lives in its own file, parses
// and validates its flags into an Options struct, and hands off to a library
// package. Nothing here keeps state in package variables except version, which
// the linker sets.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is the release version reported by "prefixd version". Release
// builds set it with:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/prefixd
//
// When it is left at "dev", the module version recorded by the Go toolchain
// (if any) is reported instead.
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "prefixd: %v\n", err)
		os.Exit(1)
	}
}
