package main

import (
	"fmt"
	"os"

	"github.com/prefixd/prefixd/internal/cli"
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
	if err := cli.Execute(newRootCommand(os.Stdout, os.Stderr)); err != nil {
		fmt.Fprintf(os.Stderr, "prefixd: %v\n", err)
		os.Exit(1)
	}
}
