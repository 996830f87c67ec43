//go:build 386 || arm || mips || mipsle

package indexer

// prefixd needs a 64-bit platform: the index counts entries and bounds
// restored snapshots in ints, and the event decoder bounds lengths of up
// to 2³² - 1 bytes in them, which a 32-bit int cannot hold (a hostile
// snapshot or frame would overflow them). This name is undefined on
// purpose, so that a 32-bit build stops here with it.
var _ = prefixd_needs_a_64_bit_platform
