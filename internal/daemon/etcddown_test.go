package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestRegisterWhileEtcdDown: with etcd stopped, 200 concurrent POST
// /register and /unregister all answer 503 "catalog: etcd unreachable …"
// with Retry-After within the write deadline and a margin, instead of
// waiting for etcd; once etcd is back on the same data, a registration
// works, and no record was left without its id claim or the other way
// round.
func TestRegisterWhileEtcdDown(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	const deadline, margin = time.Second, 3 * time.Second
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.CatalogWriteTimeout = deadline })
	reg := func(id int) map[string]any {
		return map[string]any{"instance_id": id, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 23000+id), "model_name": "m", "block_size": 16}
	}
	for id := range 10 {
		if code, body := register(t, d, reg(id)); code != http.StatusCreated {
			t.Fatalf("register %d: %d %s", id, code, body)
		}
	}
	cfg := etcd.Config()
	etcd.Close()

	hc := &http.Client{Timeout: deadline + margin} // the code before waited for etcd
	type answer struct {
		route, err string
		code       int
		retryAfter string
		body       string
		took       time.Duration
	}
	const clients = 200
	answers := make(chan answer, clients)
	var wg sync.WaitGroup
	for i := range clients {
		route, body := "/register", reg(100+i)
		if i%4 == 0 {
			route, body = "/unregister", map[string]any{"instance_id": i % 10, "model_name": "m"}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(body)
			start := time.Now()
			resp, err := hc.Post(d.url+route, "application/json", bytes.NewReader(b))
			a := answer{route: route, took: time.Since(start)}
			if err != nil {
				a.err = err.Error()
			} else {
				rb, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				a.code, a.retryAfter, a.body = resp.StatusCode, resp.Header.Get("Retry-After"), string(rb)
			}
			answers <- a
		}()
	}
	wg.Wait()
	close(answers)
	var slowest time.Duration
	for a := range answers {
		slowest = max(slowest, a.took)
		if a.err != "" || a.code != http.StatusServiceUnavailable || a.retryAfter == "" ||
			!strings.Contains(a.body, `"error":"catalog: etcd unreachable: `) || a.took > deadline+margin {
			t.Fatalf("%s while etcd is down: %d %q Retry-After %q after %v (%s); want 503 \"catalog: etcd unreachable: …\" with Retry-After within %v",
				a.route, a.code, a.body, a.retryAfter, a.took.Round(time.Millisecond), a.err, deadline+margin)
		}
	}
	t.Logf("%d writes answered 503 while etcd was down, the slowest after %v", clients, slowest.Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e2, err := etcdstore.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatalf("restart etcd on %s: %v", cfg.ClientURL, err)
	}
	t.Cleanup(func() { e2.Close() })
	testsupport.Eventually(t, 20*time.Second, "a registration once etcd is back", func() bool {
		code, _ := register(t, d, reg(999))
		return code == http.StatusCreated
	})
	raw, err := clientv3.New(clientv3.Config{Endpoints: e2.Endpoints(), DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	resp, err := raw.Get(ctx, catalog.DefaultPrefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	kvs := map[string]string{}
	for _, kv := range resp.Kvs {
		kvs[string(kv.Key)] = string(kv.Value)
	}
	records := 0
	for k, v := range kvs {
		if key, err := catalog.ParseKey("", k); err == nil {
			records++
			if claim := catalog.IDClaimPath("", key.WorkerID); kvs[claim] != k {
				t.Errorf("record %s without its claim (%s = %q)", k, claim, kvs[claim])
			}
		} else if _, ok := kvs[v]; !ok {
			t.Errorf("claim %s names %s, which does not exist", k, v)
		}
	}
	if records != 11 {
		t.Errorf("%d records; want the 10 registered before etcd stopped and the one after", records)
	}
}
