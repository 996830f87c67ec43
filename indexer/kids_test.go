package indexer

import (
	"maps"
	"testing"

	"pgregory.net/rapid"
)

// TestKidsMatchMap drives a children trie and a map with the same puts
// and deletes, keys drawn so that many share slots (a few low bits of
// entropy, or a seed of 0 with keys crafted to collide), publishing
// (moving the epoch on) at random: after every step the trie holds
// exactly the map, is well formed, and every trie published earlier still
// holds exactly what it held when published.
func TestKidsMatchMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.SampledFrom([]uint64{0, 0x9e3779b97f4a7c15}).Draw(t, "seed")
		keys := rapid.SliceOfNDistinct(rapid.Uint64(), 1, 64, rapid.ID[uint64]).Draw(t, "keys")
		if rapid.Bool().Draw(t, "colliding") {
			// Keys whose hashes share their top 55 bits: deep tries.
			for i := range keys {
				keys[i] = unmix(mix(0x1234, seed)&^(1<<9-1)|uint64(i), seed)
			}
		}
		var root *kidNode
		epoch := uint32(1)
		want := map[uint64]uint32{}
		type snap struct {
			root *kidNode
			want map[uint64]uint32
		}
		var published []snap
		check := func(what string) {
			got := map[uint64]uint32{}
			if err := checkKids(root, seed, nil, epoch+1, got); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("%s: trie %v, map %v", what, got, want)
			}
			for k, id := range want {
				if g, ok := root.get(k, mix(k, seed)); !ok || g != id {
					t.Fatalf("%s: get(%#x) = %d, %v; want %d", what, k, g, ok, id)
				}
			}
			for _, k := range keys {
				if _, in := want[k]; !in {
					if _, ok := root.get(k, mix(k, seed)); ok {
						t.Fatalf("%s: get(%#x) found a deleted key", what, k)
					}
				}
			}
			for i, s := range published {
				got := map[uint64]uint32{}
				if err := checkKids(s.root, seed, nil, epoch+1, got); err != nil || !maps.Equal(got, s.want) {
					t.Fatalf("%s: trie published %d publishes ago changed: %v, %v, want %v", what, len(published)-i, err, got, s.want)
				}
			}
		}
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			k := rapid.SampledFrom(keys).Draw(t, "key")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0, 1:
				id := rapid.Uint32Range(1, 1<<20).Draw(t, "id")
				root = kidPut(root, k, mix(k, seed), id, 0, epoch, seed)
				want[k] = id
			case 2:
				var found bool
				root, found = kidDel(root, k, mix(k, seed), 0, epoch)
				if _, in := want[k]; found != in {
					t.Fatalf("delete %#x: found %v, want %v", k, found, in)
				}
				delete(want, k)
			}
			if len(want) == 0 && root != nil {
				t.Fatalf("empty, but the trie is not nil")
			}
			check("step")
			if rapid.IntRange(0, 3).Draw(t, "publish") == 0 {
				published = append(published, snap{root, maps.Clone(want)})
				epoch++
			}
		}
	})
}

// unmix inverts mix (SplitMix64's finalizer, then the seed).
func unmix(x, seed uint64) uint64 {
	x ^= x>>31 ^ x>>62
	x *= 0x319642b2d24d8ec3
	x ^= x>>27 ^ x>>54
	x *= 0x96de1b173f119089
	x ^= x>>30 ^ x>>60
	return x ^ seed
}

func TestUnmix(t *testing.T) {
	for _, x := range []uint64{0, 1, 0xdeadbeef, ^uint64(0)} {
		if got := unmix(mix(x, 77), 77); got != x {
			t.Fatalf("unmix(mix(%#x)) = %#x", x, got)
		}
	}
}
