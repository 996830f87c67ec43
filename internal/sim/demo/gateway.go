package demo

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/leaf/httpserve"
	"github.com/prefixd/prefixd/internal/sim/gateway"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// gatewayMode names the fourth row: the workload through the test gateway
// and the daemon's endpoint picker.
const gatewayMode = "prefixd EPP (gateway)"

// startGateway runs the test gateway (package gateway: Envoy's part of
// GIE's protocol, FULL_DUPLEX_STREAMED bodies) in front of the endpoint
// picker at epp, on a loopback port, until stop.
func startGateway(ctx context.Context, epp string, cfg Config) (url string, gw *gateway.Gateway, stop func(), err error) {
	gw, err = gateway.New(gateway.Config{EPP: epp, Log: cfg.Log})
	if err != nil {
		return "", nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		gw.Close()
		return "", nil, nil, err
	}
	gctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { done <- httpserve.Serve(gctx, srv, ln, 5*time.Second) }()
	stop = func() {
		cancel()
		<-done
		gw.Close()
	}
	return "http://" + ln.Addr().String(), gw, stop, nil
}

// runGateway sends the workload through a gateway in front of the picker
// at epp, as runMode does through a proxy. The engine of each request is
// the picker's pick (prefixd_epp_picks_total, by endpoint): the gateway
// names none to the client. A request the gateway served elsewhere (a
// fallback) or answered itself fails the mode.
func runGateway(ctx context.Context, epp string, reg prometheus.Gatherer, requests []ChatRequest, pool []*mocker.Engine, cfg Config) (ModeResult, error) {
	url, gw, stop, err := startGateway(ctx, epp, cfg)
	if err != nil {
		return ModeResult{}, err
	}
	defer stop()
	before, err := picks(reg)
	if err != nil {
		return ModeResult{}, err
	}
	m, err := runMode(ctx, gatewayMode, url, requests, pool, cfg)
	if err != nil {
		return m, err
	}
	after, err := picks(reg)
	if err != nil {
		return m, err
	}
	m.PerWorker = map[uint64]int{}
	total := 0
	for _, e := range pool {
		ep := strings.TrimPrefix(e.Worker().Endpoint, "http://")
		if n := int(after[ep] - before[ep]); n > 0 {
			m.PerWorker[e.Worker().WorkerID] = n
			total += n
		}
	}
	if st := gw.Stats(); total != m.Requests || st.Fallbacks+st.ProtocolErrors+st.EPPFailures != 0 || len(st.Immediate) != 0 {
		return m, fmt.Errorf("%s: the picker picked %d engines of the pool for %d requests; gateway %+v", gatewayMode, total, m.Requests, st)
	}
	return m, nil
}

// picks reads prefixd_epp_picks_total by endpoint.
func picks(reg prometheus.Gatherer) (map[string]float64, error) {
	mf, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range mf {
		if f.GetName() != "prefixd_epp_picks_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}
