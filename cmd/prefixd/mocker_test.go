package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

func TestMockerRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mocker", "--engines", "0"}, "--engines"},
		{[]string{"mocker", "--era", "v1"}, "--era"},
		{[]string{"mocker", "--replay-layout", "new"}, "--replay-layout"},
		{[]string{"mocker", "--drop-live", "1.5"}, "--drop-live"},
		{[]string{"mocker", "--http-port", "65535", "--engines", "2"}, "--http-port"},
		{[]string{"mocker", "--etcd-endpoints", "127.0.0.1:2379"}, "--etcd-endpoints"},
		{[]string{"mocker", "--role", "router"}, "role"},
		{[]string{"mocker", "--prefill-per-token", "-1ms"}, "--prefill-per-token"},
		{[]string{"mocker", "--step-overhead", "-1ms"}, "--step-overhead"},
		{[]string{"mocker", "--kv-transfer-per-block", "-1ms"}, "--kv-transfer-per-block"},
		{[]string{"mocker", "--max-num-batched-tokens", "0"}, "--max-num-batched-tokens"},
		{[]string{"mocker", "--max-num-batched-tokens", "8", "--max-num-seqs", "16"}, "--max-num-seqs"},
		{[]string{"mocker", "--max-num-seqs", "0"}, "--max-num-seqs"},
		{[]string{"mocker", "--kv-transfer-cross-domain-factor", "0.5"}, "--kv-transfer-cross-domain-factor"},
		{[]string{"mocker", "--kv-transfer-cross-domain-factor", "NaN"}, "--kv-transfer-cross-domain-factor"},
		{[]string{"mocker", "--max-model-len", "-1"}, "--max-model-len"},
		{[]string{"mocker", "--max-body-bytes", "0"}, "--max-body-bytes"},
		{[]string{"mocker", "--flavor", "trtllm"}, "--flavor"},
		{[]string{"mocker", "--etcd-endpoints", ""}, "--etcd-endpoints: required (or --register=false)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestMockerRegistersServesAndLeaves runs two mock engines against a real
// etcd: they register with their bound endpoints, serve /generate with
// prefix caching (and the OpenAI completions route), and take their
// records with them on shutdown.
func TestMockerRegistersServesAndLeaves(t *testing.T) {
	emb := storetest.StartEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	var errOut testsupport.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs([]string{"mocker", "--etcd-endpoints", emb.Endpoints()[0], "--etcd-prefix", "/mocker-test",
		"--engines", "2", "--first-worker-id", "7", "--http-port", "0", "--block-size", "4", "--total-kv-blocks", "64",
		"--decode-per-token", "0s", "--prefill-per-token", "0s", "--step-overhead", "0s", "--topology", "zone=a", "--kv-transfer-domain", "zone"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: emb.Endpoints(), Prefix: "/mocker-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var snap catalog.Snapshot
	testsupport.Eventually(t, 30*time.Second, "two engines registered", func() bool {
		snap, err = store.List(context.Background(), 0)
		return err == nil && len(snap.Records) == 2
	})
	for i, r := range snap.Records {
		w := r.Worker
		if w.WorkerID != uint64(7+i) || !strings.HasPrefix(w.EventsEndpoint, "tcp://127.0.0.1:") ||
			!strings.HasPrefix(w.ReplayEndpoint, "tcp://127.0.0.1:") || w.BlockSize != 4 || w.TotalKVBlocks != 64 ||
			w.KVTransferDomain != "zone" || w.TopologyDomains["zone"] != "a" || strings.HasSuffix(w.Endpoint, ":0") {
			t.Errorf("record %d = %+v", i, w)
		}
		prompt := mocker.Request{TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, MaxTokens: 2}
		first, second := generate(t, w.Endpoint, prompt), generate(t, w.Endpoint, prompt)
		if first.PromptTokens != 9 || first.CachedTokens != 0 || second.CachedTokens != 8 {
			t.Errorf("worker %d: first %+v, second %+v; want 8 of 9 tokens cached the second time", w.WorkerID, first, second)
		}
		resp, err := http.Post(w.Endpoint+"/v1/completions", "application/json", strings.NewReader(`{"model": "mock-model", "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_tokens": 2}`))
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || c.Usage.Details.Cached != 8 {
			t.Errorf("worker %d: POST /v1/completions: %s, %+v (%v); want 8 tokens cached", w.WorkerID, resp.Status, c, err)
		}
	}

	// An engine whose lease is lost registers again, and says so in the
	// mocker's log.
	if err := store.Revoke(context.Background(), snap.Records[0].Lease); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 30*time.Second, "the re-registration logged", func() bool {
		return strings.Contains(errOut.String(), `msg="catalog: registered again" worker=7`)
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("mocker: %v\n%s", err, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("mocker did not stop")
	}
	snap, err = store.List(context.Background(), 0)
	if err != nil || len(snap.Records) != 0 {
		t.Errorf("after shutdown: %d records (err %v), want none", len(snap.Records), err)
	}
	// One log format (slog's text), and a shutdown line last.
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "time=") {
			t.Errorf("a line not in slog's text format: %q", l)
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `msg="mocker stopped" took=`) {
		t.Errorf("last line %q, want the shutdown line", last)
	}
}

func generate(t *testing.T, base string, req mocker.Request) mocker.Result {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(base+"/generate", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res mocker.Result
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s/generate: %s", base, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatal(err)
	}
	return res
}
