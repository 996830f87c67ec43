// Package doctest runs the examples of prefixd's Markdown documents: the
// fenced blocks of README.md and docs/*.md, as docs/README.md describes
// them. Parse reads a document's blocks and their info strings; a Session
// is a bash in a network namespace of its own, where a block's commands run
// against the real processes they start (prefixd serve with its embedded
// etcd, prefixd mocker, prefixd proxy); Run runs one block in a session and
// says, for a failure, the block's file and line, the command and what it
// printed.
//
// The package is test support: only tests import it.
package doctest
