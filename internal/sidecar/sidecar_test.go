package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

func TestAdvertise(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://*:5557":        "tcp://10.0.0.2:5557",
		"tcp://0.0.0.0:5557":  "tcp://10.0.0.2:5557",
		"tcp://[::]:5557":     "tcp://10.0.0.2:5557",
		"tcp://10.0.0.9:5557": "tcp://10.0.0.9:5557",
		"ipc:///tmp/kv":       "ipc:///tmp/kv",
		"":                    "",
	} {
		if got := Advertise(in, "10.0.0.2"); got != want {
			t.Errorf("Advertise(%q) = %q, want %q", in, got, want)
		}
	}
	if got := Advertise("tcp://*:5557", "fd00::1"); got != "tcp://[fd00::1]:5557" {
		t.Errorf("IPv6 host: %q", got)
	}
}

// TestSidecarLifecycle: the sidecar registers the engine with routable
// endpoints while its health endpoint answers, deregisters it when the
// engine turns unhealthy, registers it again when it recovers, and
// revokes the lease on exit so the worker leaves at once.
func TestSidecarLifecycle(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	var healthy atomic.Bool
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer engine.Close()
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	key := catalog.Key{Model: "meta-llama/Llama-3-8B", Group: "default", WorkerID: 11}
	registered := func() (catalog.Worker, bool) {
		w, err := store.Get(context.Background(), key)
		return w, err == nil
	}
	o := Options{
		Etcd: etcdstore.Config{Endpoints: etcd.Endpoints()},
		Worker: catalog.Worker{WorkerID: 11, ModelName: key.Model, BlockSize: 16, DataParallelSize: 2,
			EventsEndpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5600", Endpoint: engine.URL},
		AdvertiseHost: "10.1.2.3", TTL: 2 * time.Second,
		HealthURL: engine.URL + "/health", HealthInterval: 50 * time.Millisecond, HealthFailures: 2,
	}
	logs, log := testlog.New(t)
	o.Logger = log
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()

	// An engine still starting: the sidecar says what it waits for.
	logs.Wait(t, 10*time.Second, "waiting for the engine to be healthy before registering", "worker=11", "health_url="+o.HealthURL, "probe=HTTP 503 Service Unavailable")
	if _, ok := registered(); ok {
		t.Fatal("registered before the engine was healthy")
	}
	healthy.Store(true)
	testsupport.Eventually(t, 10*time.Second, "registration", func() bool { _, ok := registered(); return ok })
	logs.Wait(t, 10*time.Second, "worker registered", "worker=11", "model=meta-llama/Llama-3-8B", "ranks=[0 1]",
		"events=[0=tcp://10.1.2.3:5557 1=tcp://10.1.2.3:5558]", "replay=[0=tcp://10.1.2.3:5600 1=tcp://10.1.2.3:5601]")
	w, _ := registered()
	if ep, _ := w.EventsEndpointFor(1); ep != "tcp://10.1.2.3:5558" {
		t.Fatalf("rank 1 events endpoint %q, want the advertised host with vLLM's port offset", ep)
	}
	healthy.Store(false)
	testsupport.Eventually(t, 10*time.Second, "deregistration of an unhealthy engine", func() bool { _, ok := registered(); return !ok })
	healthy.Store(true)
	testsupport.Eventually(t, 10*time.Second, "registration after recovery", func() bool { _, ok := registered(); return ok })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := registered(); ok {
		t.Fatal("the record outlived the sidecar: its lease was not revoked")
	}
}

func TestRecordRejectsInvalid(t *testing.T) {
	o := Options{Worker: catalog.Worker{WorkerID: 1, ModelName: "m", EventsEndpoint: "tcp://*:5557"}, AdvertiseHost: "10.0.0.1"}
	if _, err := o.Record(); err == nil {
		t.Fatal("a record without block_size was accepted")
	}
}

// TestRecordRefusesPortZero: an engine told to bind tcp://*:0 picks its
// ports at start and nothing the sidecar can read says which, so the
// sidecar refuses to register the configured :0, saying why.
func TestRecordRefusesPortZero(t *testing.T) {
	for _, w := range []catalog.Worker{
		{WorkerID: 1, ModelName: "m", BlockSize: 16, EventsEndpoint: "tcp://*:0"},
		{WorkerID: 1, ModelName: "m", BlockSize: 16, EventsEndpoint: "tcp://*:5557", ReplayEndpoint: "tcp://0.0.0.0:0"},
	} {
		_, err := Options{Worker: w, AdvertiseHost: "10.0.0.2"}.Record()
		if err == nil || !strings.Contains(err.Error(), "port 0 makes the engine pick its port at start") {
			t.Errorf("Record(%s, %s) = %v", w.EventsEndpoint, w.ReplayEndpoint, err)
		}
	}
	if _, err := (Options{Worker: catalog.Worker{WorkerID: 1, ModelName: "m", BlockSize: 16, EventsEndpoint: "tcp://*:5557"}, AdvertiseHost: "10.0.0.2"}).Record(); err != nil {
		t.Fatal(err)
	}
}
