// Command prefixd is the KV-cache-aware routing daemon. This package holds
// only the cobra command tree: each subcommand lives in its own file, parses
// and validates its flags into an Options struct, and hands off to a library
// package (today: version, index-demo). Nothing here keeps state in package
// variables except version, which the linker sets.
package main
