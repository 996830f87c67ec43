// Command prefixd-bench is prefixd's benchmark lab: the routing-quality
// benchmark (routing), the index benchmark (index), the index demo
// (index-demo) and the soak (soak), which runs the prefixd binary as its
// own process under load. It links what the production binary must not:
// gonum/plot and its fonts, and the embedded Mooncake trace. Like
// cmd/prefixd, this package holds only the cobra command tree; the work is
// done in internal/sim. Nothing here keeps state in package variables
// except version, which the linker sets.
package main
