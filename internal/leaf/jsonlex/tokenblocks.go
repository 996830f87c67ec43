package jsonlex

import "unsafe"

// Token ids are read 64 bytes at a time, where the platform has a block
// reader (scanBlocks, in assembly on amd64), in blocks that hold nothing
// but ids of 1–8 digits without leading zeros, commas and single spaces
// after commas: what JSON encoders write for a token array (Python's
// json.dumps writes ", ").
//
// Reading an id after another, as fastTokens does, is a chain: where an
// id starts depends on the previous id's length, known only once its word
// is loaded and classified. The block reader breaks
// the chain in two passes over each block. It classifies the 64 bytes into
// bit masks (digits, commas, spaces, zeros) with SSE2 compares, and checks
// the block's syntax on the masks. Then it takes each id's start and end
// from the masks and converts its digits from one load (digitsValue's
// three multiplications), with nothing carried from one id to the next
// but the masks. A block off that path (any other byte, an id over 8
// digits, a leading zero) is left, from its first id, to the general
// path. Written in Go, the same two passes ran slower than fastTokens
// (BenchmarkDecodeQuery8K in internal/apiserver): the compiler spills the
// loop's state and builds each mask 8 bits at a time.

// tokenBlocks appends to dst, within its capacity and at most max, the
// token ids at d[i:] in whole 64-byte blocks, each with 8 bytes of d after
// it (an id's word may run past its block). i must be where an element
// may start (after '[' or a comma). It returns dst, the offset where the
// general path resumes (an element's start), how many ids it read, and
// stuck if it stopped at a block off the fast path rather than for want
// of data or room.
func tokenBlocks(d []byte, i int, dst []uint32, max int) (_ []uint32, resume, k int, stuck bool) {
	if !haveBlocks {
		return dst, i, 0, false
	}
	for !stuck {
		// A block ends at most 32 ids and the one begun before it.
		room := min(cap(dst)-len(dst), max-k)
		nb := min((len(d)-i-8)/64, (room-1)/32)
		if nb <= 0 {
			break
		}
		out := dst[len(dst) : len(dst)+32*nb+1]
		done, n, begun, s := scanBlocks(unsafe.SliceData(d[i:]), nb, unsafe.SliceData(out))
		dst, k, stuck = dst[:len(dst)+n], k+n, s
		adv := 64 * done
		if begun >= 0 {
			adv = begun
		}
		if adv == 0 { // an id of 64 or more digits filled the one block
			stuck = true
		}
		i += adv
	}
	return dst, i, k, stuck
}
