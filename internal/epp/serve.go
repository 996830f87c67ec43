package epp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
)

// The health services (GIE docs/proposals/004-endpoint-picker-protocol).
const (
	LivenessService  = "liveness"
	ReadinessService = "readiness"
)

// ServiceName is the ext_proc service's name, a health service too.
var ServiceName = extprocv3.ExternalProcessor_ServiceDesc.ServiceName

// TLS says how the gRPC server is secured: plaintext (the zero value), a
// certificate and key from files, or SelfSigned, a certificate made in
// memory at start (the gateway does not verify it, as with GIE's
// reference picker).
type TLS struct {
	CertFile, KeyFile string
	SelfSigned        bool
}

// Mode names the TLS mode in the startup line.
func (t TLS) Mode() string {
	switch {
	case t.SelfSigned:
		return "self-signed"
	case t.CertFile != "":
		return "files"
	}
	return "plaintext"
}

func (t TLS) config() (*tls.Config, error) {
	var cert tls.Certificate
	var err error
	switch {
	case t.SelfSigned:
		cert, err = SelfSignedCert()
	case t.CertFile != "":
		cert, err = tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("epp tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}, nil
}

// SelfSignedCert makes a certificate for the picker, valid for ten
// years, with an ECDSA P-256 key held in memory only.
func SelfSignedCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{Organization: []string{"prefixd"}, CommonName: "prefixd-epp"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// bufferPool is the gRPC server's: grpc-go's default tiers and, for
// body chunks, 64, 128 and 256 KiB.
var bufferPool = func() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 17, 18, 20)
	if err != nil {
		panic(err) // the exponents are valid on every platform Go runs on
	}
	return p
}()

// Serve serves the ext_proc and health services on ln until ctx ends,
// then stops gracefully: streams in flight get at most drain to end
// before they are cut (their bookings are freed as they end). Readiness
// (and the ext_proc service's health) follows Config.Ready, read every
// HealthInterval; liveness is SERVING while the server runs.
func (s *Server) Serve(ctx context.Context, ln net.Listener, t TLS, drain time.Duration) error {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(s.cfg.MaxBodyBytes) + 1<<20),
		// grpc-go's default pool has no tier between 32 KiB and 1 MiB,
		// and zeroes a buffer's capacity on each reuse: each body chunk
		// of up to 64 KiB (the size Envoy recommends) cleared 1 MiB.
		experimental.BufferPool(bufferPool),
	}
	tc, err := t.config()
	if err != nil {
		return err
	}
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	// A connection dialed for a tokenize request that was cancelled
	// meanwhile is pooled unused, and would hold up an engine's drain.
	defer s.cfg.Engines.CloseIdleConnections()
	srv := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(srv, s)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	ready := s.cfg.Ready()
	setReady := func(r bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if r {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus(ReadinessService, st)
		hs.SetServingStatus(ServiceName, st)
	}
	setReady(ready)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	tick := time.NewTicker(s.cfg.HealthInterval)
	defer tick.Stop()
	for {
		select {
		case err := <-served:
			return fmt.Errorf("epp grpc: %w", err)
		case <-tick.C:
			if r := s.cfg.Ready(); r != ready {
				ready = r
				setReady(r)
				s.log.Info("epp: readiness changed", "ready", r)
			}
			continue
		case <-ctx.Done():
		}
		break
	}
	hs.Shutdown() // every service NOT_SERVING while it drains
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(drain):
		s.log.Warn("epp: streams still open after the drain timeout: cut", "drain_timeout", drain)
		srv.Stop()
		<-stopped
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("epp grpc: %w", err)
	}
	return nil
}
