package apiserver

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/indexer"
)

// TestRequestMetrics: with a Registerer, every route's latency is observed
// by handler, method and status code.
func TestRequestMetrics(t *testing.T) {
	ix := indexer.New(indexer.Options{})
	if err := ix.AddPartition(indexer.PartitionKey{Model: "m", Group: api.DefaultRoutingGroup}, 4); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := newServer(t, Config{Index: ix, Registerer: reg})
	if r := s.post("/query", `{"model_name":"m","token_ids":[1,2,3,4]}`); r.status != 200 {
		t.Fatalf("query: %d %s", r.status, r.body)
	}
	s.post("/query", `{"model_name":"m","token_ids":"x"}`)
	s.get("/health")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "prefixd_http_request_duration_seconds" {
			continue
		}
		for _, m := range mf.Metric {
			key := ""
			for _, l := range m.Label {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			counts[key] = m.Histogram.GetSampleCount()
		}
	}
	for key, want := range map[string]uint64{
		"code=200 handler=/query method=post ": 1,
		"code=400 handler=/query method=post ": 1,
		"code=200 handler=/health method=get ": 1,
	} {
		if counts[key] != want {
			t.Errorf("%s: %d observations, want %d (all: %v)", key, counts[key], want, counts)
		}
	}
}

// TestTimedAsPromhttp checks that timed labels every request as
// promhttp.InstrumentHandlerDuration, which it replaces, did: for each
// method (those of the route, others, unknown ones) and each way of
// answering (a cached status, another, a Write alone, nothing), twice
// (the second from timed's cache), the same series with the same counts.
func TestTimedAsPromhttp(t *testing.T) {
	series := func(mount func(vec *prometheus.HistogramVec, m methods) http.Handler) map[string]uint64 {
		reg := prometheus.NewRegistry()
		vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d"}, []string{"handler", "method", "code"})
		reg.MustRegister(vec)
		answer := func(w http.ResponseWriter, r *http.Request) {
			switch c, _ := strconv.Atoi(r.URL.Query().Get("code")); c {
			case -1:
				w.Write([]byte("x"))
			case 0:
			default:
				w.WriteHeader(c)
			}
		}
		m := methods{http.MethodGet: answer, http.MethodPost: answer}
		h := mount(vec, m)
		for range 2 {
			for _, method := range []string{"GET", "HEAD", "POST", "DELETE", "get", "Get", "FOO"} {
				for _, code := range []int{200, 404, 431, 599, -1, 0} {
					h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, "/r?code="+strconv.Itoa(code), nil))
				}
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				key := ""
				for _, l := range m.Label {
					key += l.GetName() + "=" + l.GetValue() + " "
				}
				out[key] = m.Histogram.GetSampleCount()
			}
		}
		return out
	}
	want := series(func(vec *prometheus.HistogramVec, m methods) http.Handler {
		return promhttp.InstrumentHandlerDuration(vec.MustCurryWith(prometheus.Labels{"handler": "/r"}), m)
	})
	got := series(func(vec *prometheus.HistogramVec, m methods) http.Handler {
		return timed(vec.MustCurryWith(prometheus.Labels{"handler": "/r"}), m, m)
	})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("timed's series:\n%v\npromhttp's:\n%v", got, want)
	}
	if len(want) < 10 {
		t.Errorf("only %d series: %v", len(want), want)
	}
}

// TestStatusWriterFlushes: a handler behind timed can still flush its
// response, through http.Flusher or http.ResponseController.
func TestStatusWriterFlushes(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := &statusWriter{ResponseWriter: rec}
	sw.Write([]byte("a"))
	sw.Flush()
	if !rec.Flushed {
		t.Error("Flush did not flush")
	}
	rec = httptest.NewRecorder()
	if err := http.NewResponseController(&statusWriter{ResponseWriter: rec}).Flush(); err != nil || !rec.Flushed {
		t.Errorf("ResponseController.Flush: %v, flushed %v", err, rec.Flushed)
	}
}
