package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// startMockerCommand runs `prefixd mocker args…` (one engine, costs
// zero, on a free port) for the test's life and returns its HTTP URL.
func startMockerCommand(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut testsupport.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(append([]string{"mocker", "--engines", "1", "--http-port", "0",
		"--decode-per-token", "0s", "--prefill-per-token", "0s", "--step-overhead", "0s"}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mocker: %v\n%s", err, errOut.String())
		}
	})
	re := regexp.MustCompile(`msg="mock engine" worker=\d+ http=(\S+)`)
	var url string
	testsupport.Eventually(t, 30*time.Second, "the mock engine to serve", func() bool {
		if m := re.FindStringSubmatch(errOut.String()); m != nil {
			url = "http://" + m[1]
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("mocker exited: %v\n%s", err, errOut.String())
		default:
		}
		return false
	})
	return url
}

// runSidecar starts `prefixd sidecar args…` and returns its stderr and
// the channel its error arrives on; ctx stops it.
func runSidecar(ctx context.Context, args ...string) (*testsupport.Buffer, <-chan error) {
	var out testsupport.Buffer
	errOut := &testsupport.Buffer{}
	cmd := newRootCommand(&out, errOut)
	cmd.SetArgs(append([]string{"sidecar"}, args...))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	return errOut, done
}

// TestSidecarAsksTheEngine: `prefixd sidecar --worker-id 7 --engine-url
// URL` alone registers a mock engine, vLLM- or SGLang-flavoured, that does
// not register itself: the record has the engine's model, block size,
// capacity, batch budget and bound event endpoints, and says where each
// came from; the daemon follows its events, so a query finds the prefix
// the engine cached; the sidecar's exit takes the record with it.
func TestSidecarAsksTheEngine(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	daemonURL := startStatusDaemon(t, etcd.Endpoints())
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c := &client.Client{BaseURL: daemonURL}
	for _, tc := range []struct {
		flavor, model string
		id            uint64
		blockSource   string
	}{
		{"vllm", "mock-vllm", 7, "engine: GET /metrics vllm:cache_config_info"},
		{"sglang", "mock-sglang", 8, "engine: GET /server_info page_size"},
	} {
		t.Run(tc.flavor, func(t *testing.T) {
			engine := startMockerCommand(t, "--register=false", "--flavor", tc.flavor, "--model", tc.model,
				"--block-size", "4", "--total-kv-blocks", "64", "--max-num-batched-tokens", "512", "--max-num-seqs", "8")
			ctx, stop := context.WithCancel(context.Background())
			logs, done := runSidecar(ctx, "--etcd-endpoints", etcd.Endpoints()[0], "--worker-id", itoa(tc.id), "--engine-url", engine)
			key := catalog.Key{Model: tc.model, Group: catalog.DefaultRoutingGroup, WorkerID: tc.id}
			var w catalog.Worker
			testsupport.Eventually(t, 30*time.Second, "the sidecar to register the engine", func() bool {
				select {
				case err := <-done:
					t.Fatalf("sidecar exited: %v\n%s", err, logs.String())
				default:
				}
				w, err = store.Get(context.Background(), key)
				return err == nil
			})
			if w.BlockSize != 4 || w.TotalKVBlocks != 64 || w.MaxNumBatchedTokens != 512 || w.Endpoint != engine ||
				w.DataParallelStartRank != 0 || w.DataParallelSize != 1 ||
				!strings.HasPrefix(w.EventsEndpoint, "tcp://127.0.0.1:") || strings.HasSuffix(w.EventsEndpoint, ":0") ||
				!strings.HasPrefix(w.ReplayEndpoint, "tcp://127.0.0.1:") || w.ReplayEndpoint == w.EventsEndpoint {
				t.Fatalf("record %+v", w)
			}
			if got := w.Sources["block_size"]; got != tc.blockSource {
				t.Errorf("sources[block_size] = %q, want %q (all: %v)", got, tc.blockSource, w.Sources)
			}
			for _, f := range []string{"model_name", "total_kv_blocks", "events_endpoint", "replay_endpoint", "max_num_batched_tokens", "data_parallel_size"} {
				if !strings.HasPrefix(w.Sources[f], "engine: GET /") {
					t.Errorf("sources[%s] = %q, want the engine route (all: %v)", f, w.Sources[f], w.Sources)
				}
			}
			testsupport.Eventually(t, 10*time.Second, "the registration log line", func() bool {
				return strings.Contains(logs.String(), "worker registered") && strings.Contains(logs.String(), "block_size="+tc.blockSource)
			})

			// The engine caches a prompt; the daemon, following the events
			// of the endpoint the sidecar learned, finds the prefix there.
			body, _ := json.Marshal(mocker.Request{TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, MaxTokens: 1})
			resp, err := http.Post(engine+"/generate", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST /generate: %s", resp.Status)
			}
			var got uint64
			testsupport.Eventually(t, 30*time.Second, "the daemon to index the engine's blocks", func() bool {
				s, err := c.Query(context.Background(), api.QueryRequest{ModelName: tc.model, TokenIDs: api.TokenIDs{1, 2, 3, 4, 5, 6, 7, 8, 9}})
				got = s.Scores[tc.id][0]
				return err == nil && got == 8
			})

			stop()
			if err := <-done; err != nil {
				t.Fatalf("sidecar: %v\n%s", err, logs.String())
			}
			if _, err := store.Get(context.Background(), key); !errors.Is(err, catalog.ErrNotFound) {
				t.Fatalf("after the sidecar stopped: %v, want the record gone", err)
			}
		})
	}
}

// TestSidecarRefusesWhatContradictsTheEngine: a --block-size the engine
// contradicts, a --model it does not serve, and an engine whose prefix
// caching is off are refused at start, naming both values, and nothing is
// registered.
func TestSidecarRefusesWhatContradictsTheEngine(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	vllm := startMockerCommand(t, "--register=false", "--model", "m", "--block-size", "4")
	sglang := startMockerCommand(t, "--register=false", "--flavor", "sglang", "--model", "m", "--block-size", "4")
	noCaching := startMockerCommand(t, "--register=false", "--model", "m", "--prefix-caching=false")
	noCachingSGLang := startMockerCommand(t, "--register=false", "--flavor", "sglang", "--model", "m", "--prefix-caching=false")
	for _, tc := range []struct {
		name   string
		engine string
		args   []string
		want   []string
	}{
		{"vllm block size", vllm, []string{"--block-size", "16"},
			[]string{"--block-size 16 contradicts the engine's block_size 4 (GET /metrics vllm:cache_config_info)"}},
		{"sglang block size", sglang, []string{"--block-size", "16"},
			[]string{"--block-size 16 contradicts the engine's block_size 4 (GET /server_info page_size)"}},
		{"vllm model", vllm, []string{"--model", "other"}, []string{`--model "other" contradicts the engine, which serves "m"`}},
		{"vllm events endpoint", vllm, []string{"--events-endpoint", "tcp://127.0.0.1:1"},
			[]string{`--events-endpoint "tcp://127.0.0.1:1" contradicts the engine's events_endpoint "tcp://127.0.0.1:`}},
		{"vllm prefix caching off", noCaching, nil, []string{"the engine runs with prefix caching off (GET /metrics vllm:cache_config_info)"}},
		{"sglang prefix caching off", noCachingSGLang, nil, []string{"the engine runs with prefix caching off (GET /server_info disable_radix_cache)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			logs, done := runSidecar(ctx, append([]string{"--etcd-endpoints", etcd.Endpoints()[0], "--worker-id", "9", "--engine-url", tc.engine}, tc.args...)...)
			err := <-done
			if err == nil || ctx.Err() != nil {
				t.Fatalf("sidecar: %v (context %v), want a refusal\n%s", err, ctx.Err(), logs.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to say %q", err, w)
				}
			}
			snap, err := store.List(context.Background(), 0)
			if err != nil || len(snap.Records) != 0 {
				t.Fatalf("after a refusal: %d records (%v), want none", len(snap.Records), err)
			}
		})
	}
}

func itoa(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}
