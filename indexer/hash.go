package indexer

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// BaseSeed is the XXH3 seed of an unsalted local block hash and of the
// rolling sequence hash (Dynamo's XXH3_SEED).
const BaseSeed uint64 = 1337

// Seed returns the local-hash seed for a LoRA adapter and a cache namespace
// (vLLM's cache_salt). Empty strings mean absent, so Seed("", "") is BaseSeed.
// The additions wrap, as in Dynamo's salt contract.
func Seed(loraName, cacheNamespace string) uint64 {
	s := BaseSeed
	if loraName != "" {
		s += xxh3.HashStringSeed(loraName, 0)
	}
	if cacheNamespace != "" {
		s += xxh3.HashStringSeed(cacheNamespace, 1)
	}
	return s
}

// littleEndian reports whether uint32 tokens already have the wire byte order
// in memory, so a block can be hashed without copying it.
var littleEndian = func() bool {
	x := uint32(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// HashBlocks appends to dst the local hash of every complete block of tokens:
// XXH3-64 with seed over the block's tokens as little-endian u32. A partial
// tail block is ignored; blockSize <= 0 yields no hashes.
func HashBlocks(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if littleEndian {
		for i := 0; i < n; i++ {
			blk := tokens[i*blockSize : (i+1)*blockSize]
			b := unsafe.Slice((*byte)(unsafe.Pointer(&blk[0])), 4*blockSize)
			dst = append(dst, xxh3.HashSeed(b, seed))
		}
		return dst
	}
	buf := make([]byte, 4*blockSize)
	for i := 0; i < n; i++ {
		for j, tok := range tokens[i*blockSize : (i+1)*blockSize] {
			binary.LittleEndian.PutUint32(buf[4*j:], tok)
		}
		dst = append(dst, xxh3.HashSeed(buf, seed))
	}
	return dst
}

// HashSequence appends to dst the rolling sequence hash of each block:
// seq[0] = local[0]; seq[i] = XXH3-64(le64(seq[i-1]) || le64(local[i]), BaseSeed).
// Sequence hashes identify a prefix (used by bookings); the tree navigates
// by local hashes.
func HashSequence(dst []uint64, local []uint64) []uint64 {
	var prev uint64
	for i, h := range local {
		if i == 0 {
			prev = h
		} else {
			prev = seqNext(prev, h)
		}
		dst = append(dst, prev)
	}
	return dst
}

// seqNext is the sequence hash of the block local after the prefix whose
// sequence hash is prev.
func seqNext(prev, local uint64) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], prev)
	binary.LittleEndian.PutUint64(buf[8:], local)
	return xxh3.HashSeed(buf[:], BaseSeed)
}
