package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// TestGatewayFailureModes: a picker that cannot be reached, or whose
// stream fails before it decided, is a 503 with FailClose; with FailOpen
// the original request (its whole body, also one the picker had partly
// received) goes to the fail-open endpoints in order. The gateway logs
// the picker unreachable once, and reachable again when it answers.
func TestGatewayFailureModes(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	tr := newTranscript()
	var calls atomic.Int64
	healthy := picker(tr, FullDuplexStreamed, func(*corev3.HeaderMap, []byte) decision { return route(up.addr) })
	// The first two streams fail after the request headers.
	flaky := startEPP(t, nil, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if calls.Add(1) <= 2 {
			if _, err := s.Recv(); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "picker restarting")
		}
		return healthy(s)
	})
	dead := closedAddr(t)
	body := `{"prompt":"` + strings.Repeat("long prompt ", 10_000) + `"}`
	for _, tc := range []struct {
		name     string
		epp      string
		mode     FailureMode
		status   int
		prefix   string
		failOpen uint64
	}{
		{"unreachable FailClose", dead, FailClose, 503, "endpoint picker unavailable", 0},
		{"unreachable FailOpen", dead, FailOpen, 200, "u1 POST /v1/completions", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec, log := testlog.New(t)
			g, url := startGateway(t, Config{EPP: tc.epp, FailureMode: tc.mode, FailOpenEndpoints: []string{closedAddr(t), up.addr}, Log: log})
			for range 2 {
				resp, got := post(t, url+"/v1/completions", body, map[string]string{"Content-Type": "application/json"})
				if resp.StatusCode != tc.status || !strings.HasPrefix(got, tc.prefix) {
					t.Fatalf("client got %d %.200q", resp.StatusCode, got)
				}
				if tc.mode == FailOpen && !strings.HasSuffix(got, " body="+body) {
					t.Fatal("the fail-open endpoint did not get the whole body")
				}
			}
			if st := g.Stats(); st.EPPFailures != 2 || st.FailOpen != 2*tc.failOpen || st.Fallbacks != 2*tc.failOpen {
				t.Fatalf("stats %+v", st)
			}
			if n := rec.Count("gateway: endpoint picker unreachable", "epp="+tc.epp); n != 1 {
				t.Fatalf("logged unreachable %d times", n)
			}
		})
	}
	t.Run("stream fails, then recovers", func(t *testing.T) {
		t.Parallel()
		rec, log := testlog.New(t)
		g, url := startGateway(t, Config{EPP: flaky, FailureMode: FailOpen, FailOpenEndpoints: []string{up.addr}, Log: log})
		for i := range 3 {
			resp, got := post(t, url+"/v1/completions", body, map[string]string{"Content-Type": "application/json"})
			if resp.StatusCode != 200 || !strings.HasSuffix(got, " body="+body) {
				t.Fatalf("request %d: client got %d %.200q", i, resp.StatusCode, got)
			}
		}
		if st := g.Stats(); st.EPPFailures != 2 || st.FailOpen != 2 {
			t.Fatalf("stats %+v", st)
		}
		rec.Wait(t, 10*time.Second, "gateway: endpoint picker reachable again")
		if n := rec.Count("gateway: endpoint picker unreachable"); n != 1 {
			t.Fatalf("logged unreachable %d times", n)
		}
	})
}

// selfSigned returns a certificate for 127.0.0.1 and a pool holding it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "epp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestGatewayTLS: a picker serving TLS is reached with its CA, or with
// InsecureSkipVerify as a self-signed one; a plaintext gateway cannot
// reach it (FailClose: 503).
func TestGatewayTLS(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	cert, pool := selfSigned(t)
	tr := newTranscript()
	epp := startEPP(t, &tls.Config{Certificates: []tls.Certificate{cert}},
		picker(tr, FullDuplexStreamed, func(*corev3.HeaderMap, []byte) decision { return route(up.addr) }))
	for _, tc := range []struct {
		name   string
		tls    *tls.Config
		status int
	}{
		{"CA", &tls.Config{RootCAs: pool}, 200},
		{"InsecureSkipVerify", &tls.Config{InsecureSkipVerify: true}, 200},
		{"plaintext", nil, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, url := startGateway(t, Config{EPP: epp, TLS: tc.tls})
			resp, body := post(t, url+"/v1/completions", `{"prompt":"hi"}`, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("client got %d %q", resp.StatusCode, body)
			}
			if st := g.Stats(); (st.EPPFailures == 1) != (tc.status == 503) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
