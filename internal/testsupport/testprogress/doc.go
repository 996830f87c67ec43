// Command testprogress reads the output of `go test -json` on its standard
// input and prints what a person or a CI log needs while a long test run
// goes on (`make test` pipes its go test runs through it):
//
//   - each package's result line as the package finishes (`ok`, `FAIL` or
//     `?`, with its time, as go test prints them);
//   - for each failed test, its whole output (subtests included), as soon
//     as it fails; for a failed package, the output of the tests it left
//     unfinished (a panic, an os.Exit, a timeout) and its own;
//   - the build output of a package that did not build, as it comes;
//   - every -every (20 s by default) a line naming the packages still
//     running, how long each has run, and its longest-running test;
//   - at the end, a count and the list of what failed.
//
// A line that is not a JSON event (go test may print text when something
// goes badly wrong) is copied as it is. testprogress exits 1 when a test, a
// package or a build failed, when a package started but never finished,
// or when the input held no test event at all; it cannot see go test's own
// exit status, so a caller pipes with `set -o pipefail` to keep it.
//
// It is test infrastructure: nothing imports it and no shipped binary
// contains it.
package main
