package etcdstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
)

// TestEtcdTLS connects through EtcdConfig's TLS files to an etcd that
// requires client certificates.
func TestEtcdTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, caKey := newCert(t, dir, "ca", nil, nil)
	newCert(t, dir, "server", ca, caKey)
	newCert(t, dir, "client", ca, caKey)

	ec := embed.NewConfig()
	ec.Dir = filepath.Join(dir, "data")
	curl, purl := freeURL(t, "https"), freeURL(t, "http")
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ClientTLSInfo = transport.TLSInfo{
		CertFile:       filepath.Join(dir, "server.crt"),
		KeyFile:        filepath.Join(dir, "server.key"),
		TrustedCAFile:  filepath.Join(dir, "ca.crt"),
		ClientCertAuth: true,
	}
	ec.LogLevel, ec.UnsafeNoFsync = "error", true
	e, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		t.Fatal("TLS etcd not ready")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := etcdstore.Config{
		Endpoints:   []string{curl.String()},
		Prefix:      uniquePrefix(),
		CertFile:    filepath.Join(dir, "client.crt"),
		KeyFile:     filepath.Join(dir, "client.key"),
		CAFile:      filepath.Join(dir, "ca.crt"),
		DialTimeout: 3 * time.Second,
	}
	s, err := etcdstore.New(ctx, cfg)
	if err != nil {
		t.Fatalf("with client certificate: %v", err)
	}
	defer s.Close()
	w := storetest.Worker("m", "g", 1)
	if _, err := s.Put(ctx, w, catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, w.Key()); err != nil || !got.Equal(w) {
		t.Fatalf("Get over TLS: %+v, %v", got, err)
	}

	noCert := cfg
	noCert.CertFile, noCert.KeyFile = "", ""
	if s, err := etcdstore.New(ctx, noCert); err == nil {
		s.Close()
		t.Fatal("connected without a client certificate to an etcd that requires one")
	} else {
		t.Logf("without a client certificate: %v", err)
	}
}

func TestEtcdConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg etcdstore.Config
		ok  bool
	}{
		{etcdstore.Config{Endpoints: []string{"http://127.0.0.1:2379"}}, true},
		{etcdstore.Config{}, false},
		{etcdstore.Config{Endpoints: []string{"127.0.0.1:2379"}}, false},
		{etcdstore.Config{Endpoints: []string{"https://e:2379"}, Username: "root"}, false},
		{etcdstore.Config{Endpoints: []string{"https://e:2379"}, CertFile: "c.pem"}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
	}
}

func freeURL(t *testing.T, scheme string) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: scheme, Host: l.Addr().String()}
}

// newCert writes <name>.crt and <name>.key in dir: a CA when parent is
// nil, else a leaf for 127.0.0.1 signed by parent.
func newCert(t *testing.T, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	signer, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		signer, signerKey = parent, parentKey
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(file, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(name+".crt", "CERTIFICATE", der)
	write(name+".key", "EC PRIVATE KEY", keyDER)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}
