//go:build !amd64 || purego

package jsonlex

const haveBlocks = false

func scanBlocks(p *byte, nb int, out *uint32) (done, k, begun int, stuck bool) {
	panic("unreachable")
}
