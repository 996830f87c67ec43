package catalog_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
)

func TestReplicaValidate(t *testing.T) {
	ok := catalog.Replica{Version: catalog.RecordVersion, ID: "prefixd-0", SyncAddress: "10.0.0.1:8092", StartedAt: time.Unix(1, 0)}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit func(*catalog.Replica)
		want string
	}{
		{func(r *catalog.Replica) { r.Version = 0 }, "version: missing"},
		{func(r *catalog.Replica) { r.ID = "" }, "replica_id: must be 1 to 253"},
		{func(r *catalog.Replica) { r.ID = strings.Repeat("x", 254) }, "replica_id"},
		{func(r *catalog.Replica) { r.ID = "a\nb" }, "replica_id"},
		{func(r *catalog.Replica) { r.SyncAddress = "nohost" }, `sync_address: "nohost" is not a host:port`},
		{func(r *catalog.Replica) { r.SyncAddress = ":8092" }, "sync_address"},
		{func(r *catalog.Replica) { r.SyncAddress = "h:0" }, "sync_address"},
		{func(r *catalog.Replica) { r.SyncAddress = "h:70000" }, `sync_address: port "70000" is not 1 to 65535`},
		{func(r *catalog.Replica) { r.StartedAt = time.Time{} }, "started_at: must be set"},
	} {
		r := ok
		c.edit(&r)
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", r, err, c.want)
		}
	}
}

func TestReplicaKeyAndRecord(t *testing.T) {
	r := catalog.Replica{Version: catalog.RecordVersion, ID: "pod/a b", SyncAddress: "[::1]:8092", StartedAt: time.Unix(5, 0).UTC()}
	path := catalog.ReplicaPath("", r.ID)
	if path != "/prefixd/v1/replicas/pod%2Fa%20b" {
		t.Fatalf("path %q", path)
	}
	if id, err := catalog.ParseReplicaPath("", path); err != nil || id != r.ID {
		t.Fatalf("parse %q: %q %v", path, id, err)
	}
	for _, bad := range []string{"/prefixd/v1/replicas/", "/prefixd/v1/replicas/pod/a", "/prefixd/v1/workers/x", "/prefixd/v1/replicas/%zz"} {
		if _, err := catalog.ParseReplicaPath("", bad); err == nil {
			t.Errorf("ParseReplicaPath(%q) accepted", bad)
		}
	}
	b, err := catalog.EncodeReplica(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := catalog.DecodeReplica("", path, b)
	if err != nil || got != r {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if _, err := catalog.DecodeReplica("", catalog.ReplicaPath("", "other"), b); err == nil || !strings.Contains(err.Error(), "body is for replica") {
		t.Fatalf("a body under another id's key: %v", err)
	}
	if _, err := catalog.DecodeReplica("", path, []byte(`{"version":1}`)); err == nil {
		t.Fatal("an invalid record decoded")
	}
	if _, err := catalog.EncodeReplica(catalog.Replica{}); err == nil {
		t.Fatal("an invalid record encoded")
	}
}
