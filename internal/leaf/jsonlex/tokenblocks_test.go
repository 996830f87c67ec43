package jsonlex

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTokenBlockBytes puts every byte value at every offset of the
// first blocks of a token array, against encoding/json: a byte misread
// by the blocks' masks (a digit, comma, space or zero where there is
// none) shows as ids or an acceptance that differ.
func TestTokenBlockBytes(t *testing.T) {
	const prefix = `{"model_name":"m","token_ids":[`
	var ids strings.Builder
	for j := 0; ids.Len() < 200; j++ {
		ids.WriteString([]string{"1", "20", "0", "4057", "123456", "99999999", "7"}[j%7])
		ids.WriteString([]string{",", ", "}[j/7%2])
	}
	all := make([]byte, 256)
	for v := range all {
		all[v] = byte(v)
	}
	accepted := 0
	// Shifted by a first id of 1–8 digits, every kind of id starts and
	// ends at every offset of a block, and runs across each block boundary.
	for shift := 0; shift < 8; shift++ {
		base := prefix + "12345678"[:shift+1] + "," + ids.String() + `5]}`
		values := all
		if shift > 0 {
			values = []byte("019, \n.e-]\x00\x80")
		}
		for off := len(prefix); off < len(prefix)+160; off++ {
			for _, v := range values {
				body := []byte(base)
				body[off] = v
				ids, err := readTokenIDs(body, 1<<20)
				var want struct {
					TokenIDs []uint32 `json:"token_ids"`
				}
				jerr := json.Unmarshal(body, &want)
				if (err == nil) != (jerr == nil) || err == nil && !slices.Equal(ids, want.TokenIDs) {
					t.Fatalf("shift %d, byte %d = %#x: lexer %v %v, encoding/json %v %v", shift, off-len(prefix), v, ids, err, want.TokenIDs, jerr)
				}
				if err == nil {
					accepted++
				}
			}
		}
	}
	if accepted < 160*10 {
		t.Fatalf("%d bodies accepted: the blocks were not read", accepted)
	}
}

// TestTokenBlocksReadArrays checks that the blocks read what they should
// (the tests above would pass with blocks that never read anything): a
// long array in either separator style whole, but for its tail, and one
// with an id of 9 digits up to that id's block, resuming at its first
// element; and, on a platform without a block reader, nothing.
func TestTokenBlocksReadArrays(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, sep := range []string{",", ", "} {
		var ids []string
		for range 2000 {
			ids = append(ids, strconv.Itoa(int(r.Uint32N(200_000))))
		}
		arr := strings.Join(ids, sep) + "]"
		dst, i, k, stuck := tokenBlocks([]byte(arr), 0, make([]uint32, 0, 4096), 4096)
		if !haveBlocks { // the word-at-a-time reader takes it all
			if k != 0 || i != 0 || stuck || len(dst) != 0 {
				t.Fatalf("sep %q: no block reader, yet read %d ids to offset %d, stuck %v", sep, k, i, stuck)
			}
			continue
		}
		if stuck || len(arr)-i > 64+8+8 || k != len(dst) {
			t.Fatalf("sep %q: read %d ids to offset %d of %d, stuck %v", sep, k, i, len(arr), stuck)
		}
		for j, v := range dst {
			if strconv.Itoa(int(v)) != ids[j] {
				t.Fatalf("sep %q: id %d = %d, want %s", sep, j, v, ids[j])
			}
		}
		if want := strings.Join(ids[:k], sep) + sep; arr[:i] != want && arr[:i] != strings.TrimSuffix(want, " ") {
			t.Fatalf("sep %q: resumes at %d, not after id %d", sep, i, k)
		}
		// An id of 9 digits at about offset 1000: the blocks stop at its
		// block, whose first element (after the last id they read) is where
		// the general path resumes.
		ids[170] = "123456789"
		arr = strings.Join(ids, sep) + "]"
		at := strings.Index(arr, "123456789")
		_, i, k, stuck = tokenBlocks([]byte(arr), 0, make([]uint32, 0, 4096), 4096)
		if !stuck || i > at || at-i > 64 || k >= 170 {
			t.Fatalf("sep %q: a 9-digit id at %d: read %d ids to %d, stuck %v", sep, at, k, i, stuck)
		}
		if want := strings.Join(ids[:k], sep) + sep; arr[:i] != want && arr[:i] != strings.TrimSuffix(want, " ") {
			t.Fatalf("sep %q: resumes at %d, not after id %d", sep, i, k)
		}
	}
}

// TestTokenArrays reads long token arrays, as the blocks see them, in
// every layout a client writes and with every kind of element the blocks
// must leave to the general path, against encoding/json: the same ids,
// or both rejecting the body.
func TestTokenArrays(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	seps := []string{",", ", ", ",\n  ", " , ", ",\t", ",,", ", ,", ",  ", " ,"}
	odd := []string{"01", "00", strings.Repeat("1", 70), strings.Repeat("2", 130), "4294967295", "4294967296", "123456789", "1.5", "1e3", "-1", "0", `"7"`, "1 2", "99999999", "100000000"}
	var checked, accepted int
	for round := 0; round < 3000; round++ {
		n := 1 + r.IntN(400)
		sep := seps[0]
		if r.IntN(3) == 0 {
			sep = seps[1]
		}
		var b strings.Builder
		b.WriteString(`{"model_name":"m","token_ids":[`)
		if r.IntN(4) == 0 {
			b.WriteString(" ")
		}
		for j := 0; j < n; j++ {
			if j > 0 {
				if r.IntN(200) == 0 {
					b.WriteString(seps[r.IntN(len(seps))])
				} else {
					b.WriteString(sep)
				}
			}
			switch x := r.IntN(1000); {
			case x == 0:
				b.WriteString(odd[r.IntN(len(odd))])
			case x < 100:
				b.WriteString(strconv.Itoa(r.IntN(10)))
			default:
				b.WriteString(strconv.FormatUint(uint64(r.Uint32N(1<<(1+r.IntN(27)))), 10))
			}
		}
		b.WriteString(`]}`)
		body := []byte(b.String())
		for _, limit := range []int{1 << 20, n, n - 1} {
			checked++
			ids, err := readTokenIDs(body, limit)
			var want struct {
				TokenIDs []uint32 `json:"token_ids"`
			}
			jerr := json.Unmarshal(body, &want)
			if jerr == nil && len(want.TokenIDs) > limit {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d tokens", limit)) {
					t.Fatalf("%d ids, limit %d: got %v, want the limit's error", len(want.TokenIDs), limit, err)
				}
				continue
			}
			if (err == nil) != (jerr == nil) {
				t.Fatalf("body %q: lexer %v, encoding/json %v", body, err, jerr)
			}
			if err == nil {
				accepted++
				if !slices.Equal(ids, want.TokenIDs) {
					t.Fatalf("body %q: ids differ", body)
				}
			}
		}
	}
	if accepted < checked/4 || accepted == checked {
		t.Fatalf("%d of %d bodies accepted: the cases do not cover both ways", accepted, checked)
	}
}
