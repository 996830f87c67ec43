package importcheck

import (
	"slices"
	"testing"
)

// TestLayers: every package of the module is in a room, and imports only
// from its own room or the rooms below (docs/architecture.md).
func TestLayers(t *testing.T) { Layers(t) }

func TestRoomOf(t *testing.T) {
	room := func(name string) int {
		return slices.IndexFunc(Rooms, func(r Room) bool { return r.Name == name })
	}
	for rel, want := range map[string]string{
		"internal/leaf/clip":              "leaves",
		"indexer":                         "domain",
		"indexer/workload":                "domain",
		"events/stream":                   "domain",
		"catalog/etcdstore":               "domain",
		"catalog/storetest":               "test support",
		"api":                             "public",
		"internal/apiserver":              "adapters",
		"internal/sim/mocker":             "lab",
		"internal/sim/mocker/publishtest": "test support",
		"cmd/prefixd":                     "commands",
	} {
		if got := RoomOf(rel); got != room(want) {
			t.Errorf("RoomOf(%q) = %d, want %d (%s)", rel, got, room(want), want)
		}
	}
	if RoomOf("internal/nowhere") != -1 || RoomOf("apis") != -1 {
		t.Error("a package outside every room has a room")
	}
}

func TestUpward(t *testing.T) {
	out := []byte(Module + "/indexer " + Module + "/internal/leaf/clip fmt\n" +
		Module + "/api " + Module + "/internal/apiserver\n" +
		Module + "/internal/nowhere\n" +
		"fmt\n")
	got := upward(out)
	want := []string{
		"api (public) imports internal/apiserver (adapters), a room above",
		"internal/nowhere is in no room of importcheck.Rooms",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("upward = %q, want %q", got, want)
	}
}
