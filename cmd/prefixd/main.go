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
