// Package status builds what "prefixd status" shows of a running prefixd:
// from its GET /workers list and its GET /metrics page, one Frame — every
// worker rank with the state of its event stream (applied and seen seqs,
// lag, replays, gaps, restarts, routed requests), the index's size, the
// catalog's health and the disaggregated plans — rendered as a text table
// or as JSON, and redrawn in place on a terminal.
//
// Build and the renderers are pure functions of their inputs: fetching the
// pages, the clock and the refresh loop belong to the command.
package status
