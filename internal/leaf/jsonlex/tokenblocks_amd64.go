//go:build !purego

package jsonlex

// scanBlocks reads the token ids of nb 64-byte blocks at p, each with 8
// readable bytes after it, into out, which has room for 32·nb+1 ids. p
// must be where an element may start. It returns the blocks read whole,
// the ids they hold, the offset from p of the id running on past them
// (-1 if none), and stuck if it stopped at a block off the fast path.
//
//go:noescape
func scanBlocks(p *byte, nb int, out *uint32) (done, k, begun int, stuck bool)

const haveBlocks = true
