package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// EmbeddedConfig configures an in-process single-member etcd.
type EmbeddedConfig struct {
	// Dir is the data directory (required; created if missing). A server
	// started again on the same Dir keeps its data, revisions and leases.
	Dir string
	// ClientURL is where clients connect, e.g. "http://127.0.0.1:2379";
	// "" picks a free loopback port (see StartEmbedded).
	ClientURL string
	// PeerURL is the (unused, but required) peer listener; "" picks a
	// free loopback port.
	PeerURL string
	// Name is the member name (default "prefixd").
	Name string
	// StartTimeout bounds the wait for the server to be ready (default
	// 60 s).
	StartTimeout time.Duration
	// CompactionRetention is the history etcd keeps (periodic
	// auto-compaction; default 1 h; negative disables).
	CompactionRetention time.Duration
	// LogLevel is etcd's own log level on stderr (default "error").
	LogLevel string
	// UnsafeNoFsync skips fsync: faster, loses data on a machine crash.
	// For tests.
	UnsafeNoFsync bool
}

// Embedded is a running in-process etcd server.
type Embedded struct {
	etcd    *embed.Etcd
	cfg     EmbeddedConfig
	close   sync.Once
	closing *atomic.Bool
}

// StartEmbedded starts an etcd server in cfg.Dir, listening on loopback
// (or cfg's URLs), and returns once it serves clients. The server runs
// its own goroutines until Close. Startup takes about a second
// (longer under the race detector).
//
// A port it picks (an empty ClientURL or PeerURL) was free a moment
// before etcd binds it; if another socket takes it in between, it picks
// again, up to pickAttempts times in all. A URL given in cfg that is in
// use fails at once.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	return startEmbedded(ctx, cfg, freeLoopbackURL)
}

// pickAttempts is how often StartEmbedded picks free ports before it
// gives up.
const pickAttempts = 5

// startEmbedded is StartEmbedded with the way it picks a free loopback
// URL.
func startEmbedded(ctx context.Context, cfg EmbeddedConfig, pick func() (string, error)) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("embedded etcd: a data dir is required")
	}
	if cfg.Name == "" {
		cfg.Name = "prefixd"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.CompactionRetention == 0 {
		cfg.CompactionRetention = time.Hour
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	for attempt := 1; ; attempt++ {
		c := cfg
		var picked []string
		for _, u := range []*string{&c.ClientURL, &c.PeerURL} {
			if *u != "" {
				continue
			}
			var err error
			if *u, err = pick(); err != nil {
				return nil, err
			}
			picked = append(picked, *u)
		}
		e, err := start(ctx, c)
		if err == nil || attempt == pickAttempts || !inUse(err, picked) {
			return e, err
		}
	}
}

// inUse reports whether err is the failure to bind one of the URLs.
func inUse(err error, urls []string) bool {
	var op *net.OpError
	if !errors.Is(err, syscall.EADDRINUSE) || !errors.As(err, &op) || op.Addr == nil {
		return false
	}
	return slices.Contains(urls, "http://"+op.Addr.String())
}

// start starts the server on cfg, its URLs and defaults filled in.
func start(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	curl, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: client URL %q: %w", cfg.ClientURL, err)
	}
	purl, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: peer URL %q: %w", cfg.PeerURL, err)
	}

	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*curl}
	ec.AdvertiseClientUrls = []url.URL{*curl}
	ec.ListenPeerUrls = []url.URL{*purl}
	ec.AdvertisePeerUrls = []url.URL{*purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.LogLevel = cfg.LogLevel
	closing := new(atomic.Bool)
	zc := logutil.DefaultZapLoggerConfig
	zc.Level = zap.NewAtomicLevelAt(logutil.ConvertToZapLevel(cfg.LogLevel))
	lg, err := zc.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return quietClose{c, closing} }))
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: logger: %w", err)
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	if cfg.CompactionRetention > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.CompactionRetention.String()
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd in %s on %s: %w", cfg.Dir, cfg.ClientURL, err)
	}
	timer := time.NewTimer(cfg.StartTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return &Embedded{etcd: e, cfg: cfg, closing: closing}, nil
	case err = <-e.Err():
		err = fmt.Errorf("embedded etcd in %s: %w", cfg.Dir, err)
	case <-timer.C:
		err = fmt.Errorf("embedded etcd in %s: not ready within %v", cfg.Dir, cfg.StartTimeout)
	case <-ctx.Done():
		err = fmt.Errorf("embedded etcd in %s: %w", cfg.Dir, ctx.Err())
	}
	e.Server.Stop()
	e.Close()
	return nil, err
}

// Endpoints returns the client URLs, for Config.Endpoints.
func (e *Embedded) Endpoints() []string { return []string{e.cfg.ClientURL} }

// Config returns the configuration the server runs with, its URLs filled
// in: StartEmbedded(ctx, e.Config()) after Close restarts the same member
// on the same ports.
func (e *Embedded) Config() EmbeddedConfig { return e.cfg }

// Err reports a fatal server error after startup.
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// Close stops the server and waits for it. Clients see the connection
// drop; their keep-alives and requests fail until a server is back.
// Later calls do nothing.
func (e *Embedded) Close() error {
	e.close.Do(func() {
		e.closing.Store(true)
		e.etcd.Close()
	})
	return nil
}

// quietClose drops the "serving failed" errors etcd logs, with stack
// traces, for each listener it closes itself during a clean shutdown.
type quietClose struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q quietClose) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() && ent.Message == "setting up serving from embedded etcd failed." {
		return ce
	}
	return q.Core.Check(ent, ce)
}

func (q quietClose) With(f []zapcore.Field) zapcore.Core {
	return quietClose{q.Core.With(f), q.closing}
}

// freeLoopbackURL returns http://127.0.0.1:<a port that was free>.
func freeLoopbackURL() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("embedded etcd: find a free port: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("embedded etcd: find a free port: %w", err)
	}
	return "http://" + addr, nil
}
