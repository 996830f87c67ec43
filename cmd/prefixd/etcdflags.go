package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
)

// etcdFlags are the etcd client flags shared by serve, sidecar and mocker.
type etcdFlags struct {
	endpoints []string
	prefix    string
	user      string
	password  string
	cert      string
	key       string
	ca        string
}

func newEtcdFlags(endpoints ...string) etcdFlags {
	return etcdFlags{endpoints: endpoints, prefix: catalog.DefaultPrefix}
}

func (f *etcdFlags) AddFlags(fs *pflag.FlagSet, endpointsHelp string) {
	fs.StringSliceVar(&f.endpoints, "etcd-endpoints", f.endpoints, endpointsHelp)
	fs.StringVar(&f.prefix, "etcd-prefix", f.prefix, "key prefix of the worker catalog in etcd")
	fs.StringVar(&f.user, "etcd-user", f.user, "etcd username")
	fs.StringVar(&f.password, "etcd-password", f.password, "etcd password (prefer PREFIXD_ETCD_PASSWORD)")
	fs.StringVar(&f.cert, "etcd-cert", f.cert, "client certificate file for etcd TLS")
	fs.StringVar(&f.key, "etcd-key", f.key, "client key file for etcd TLS")
	fs.StringVar(&f.ca, "etcd-ca", f.ca, "CA file to verify etcd's certificate")
}

// Validate checks the flags; with no endpoints only the pairing of
// certificate and key (serve then runs an embedded etcd).
func (f *etcdFlags) Validate() error {
	if (f.cert == "") != (f.key == "") {
		return fmt.Errorf("--etcd-cert and --etcd-key go together")
	}
	if len(f.endpoints) == 0 {
		return nil
	}
	if err := f.Config().Validate(); err != nil {
		return fmt.Errorf("--etcd-endpoints: %w", err)
	}
	return nil
}

func (f *etcdFlags) Config() etcdstore.Config {
	return etcdstore.Config{Endpoints: f.endpoints, Prefix: f.prefix, Username: f.user, Password: f.password,
		CertFile: f.cert, KeyFile: f.key, CAFile: f.ca}
}
