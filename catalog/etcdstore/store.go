package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// Config is how to reach etcd. The serve and sidecar commands map
// their flags onto it.
type Config struct {
	// Endpoints are client URLs, e.g. "http://127.0.0.1:2379" (https with
	// TLS). Required.
	Endpoints []string
	// Prefix is the key prefix (default DefaultPrefix).
	Prefix string
	// Username and Password enable etcd authentication (both or neither).
	Username string
	Password string
	// CertFile and KeyFile are a client certificate (both or neither);
	// CAFile verifies the server. Any of them turns TLS on.
	CertFile string
	KeyFile  string
	CAFile   string
	// DialTimeout bounds connecting, authenticating and the first read
	// New makes (default 5 s).
	DialTimeout time.Duration
	// ReconnectMaxDelay caps the delay between reconnection attempts
	// while etcd is down (default 1 s; gRPC's own default is 2 minutes,
	// which would leave leases expiring long after etcd came back).
	ReconnectMaxDelay time.Duration
}

// Validate reports configuration mistakes, naming the field.
func (c Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("etcd endpoints: at least one is required"))
	}
	for _, e := range c.Endpoints {
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") && !strings.HasPrefix(e, "unix://") && !strings.HasPrefix(e, "unixs://") {
			errs = append(errs, fmt.Errorf("etcd endpoints: %q is not an http(s) or unix URL", e))
		}
	}
	if (c.Username == "") != (c.Password == "") {
		errs = append(errs, errors.New("etcd username and password: set both or neither"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("etcd cert and key files: set both or neither"))
	}
	return errors.Join(errs...)
}

func (c Config) tls() bool { return c.CertFile != "" || c.KeyFile != "" || c.CAFile != "" }

// Store is the Store on etcd (client v3). Keys live under the
// configured prefix (see Key.Path); values are the records' JSON; leases
// are etcd leases. It is safe for concurrent use.
type Store struct {
	cli       *clientv3.Client
	prefix    string
	endpoints []string
	// watchCheck is how often a watch verifies that etcd is the same
	// cluster with its history (WatchCheckInterval; tests shorten it).
	watchCheck time.Duration
	// checkFailures counts watch header reads that failed.
	checkFailures atomic.Uint64
}

// WatchCheckInterval is how often a watch asks etcd for its cluster id and
// revision, to catch an outage the connection state did not show and a
// restart that lost the history the watch resumed from.
const WatchCheckInterval = 2 * time.Second

var _ catalog.Store = (*Store)(nil)

// listPage is how many records one List request fetches.
const listPage = 500

// New connects to etcd and checks that it can read the prefix,
// so a wrong endpoint, a missing or wrong password or missing permissions
// fail here with an error that says which. It starts no goroutine of its
// own (the etcd client runs its connection machinery until Close).
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.ReconnectMaxDelay <= 0 {
		cfg.ReconnectMaxDelay = time.Second
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = 100 * time.Millisecond
	bo.MaxDelay = cfg.ReconnectMaxDelay
	ccfg := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		Username:    cfg.Username,
		Password:    cfg.Password,
		Logger:      zap.NewNop(), // errors surface through this package's returns
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: cfg.DialTimeout})},
	}
	if cfg.tls() {
		tc, err := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		ccfg.TLS = tc
	}
	eps := strings.Join(cfg.Endpoints, ",")
	cli, err := clientv3.New(ccfg)
	if err != nil {
		if errors.Is(err, rpctypes.ErrAuthFailed) {
			return nil, fmt.Errorf("etcd %s: authentication failed for user %q (wrong username or password): %w", eps, cfg.Username, err)
		}
		return nil, fmt.Errorf("etcd %s: connect: %w", eps, err)
	}
	s := &Store{cli: cli, prefix: catalog.NormPrefix(cfg.Prefix), endpoints: cfg.Endpoints}
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	_, err = cli.Get(cctx, catalog.WorkersPrefix(s.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		cli.Close()
		switch {
		case errors.Is(err, rpctypes.ErrUserEmpty):
			return nil, fmt.Errorf("etcd %s: the server requires authentication; set a username and password: %w", eps, err)
		case errors.Is(err, rpctypes.ErrPermissionDenied):
			return nil, fmt.Errorf("etcd %s: user %q may not read %s: %w", eps, cfg.Username, catalog.WorkersPrefix(s.prefix), err)
		case errors.Is(err, context.DeadlineExceeded):
			return nil, fmt.Errorf("etcd %s: not reachable within %v (down, wrong address, or a TLS mismatch such as a missing client certificate): %w", eps, cfg.DialTimeout, err)
		}
		return nil, fmt.Errorf("etcd %s: read %s: %w", eps, catalog.WorkersPrefix(s.prefix), err)
	}
	return s, nil
}

// Prefix returns the key prefix.
func (s *Store) Prefix() string { return s.prefix }

// Ping reads the catalog's key count (no values) and returns the store
// revision: a cheap check that etcd answers, for health metrics.
func (s *Store) Ping(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, catalog.WorkersPrefix(s.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, s.etcdErr("ping", err)
	}
	return resp.Header.Revision, nil
}

// Close closes the client. Leases are not revoked (Session.Close does
// that), so records written with them stay until their TTL runs out.
func (s *Store) Close() error { return s.cli.Close() }

// etcdErr wraps err, adding the catalog's sentinel for the etcd errors
// callers branch on.
func (s *Store) etcdErr(op string, err error) error {
	return s.etcdErrAfter(op, 0, err)
}

// etcdErrAfter is etcdErr for a compare-and-swap that lost attempts to
// concurrent writers before err.
func (s *Store) etcdErrAfter(op string, lost int, err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%s: %w: %w", op, catalog.ErrLeaseNotFound, err)
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%s: %w: %w", op, catalog.ErrCompacted, err)
	case unreachable(err):
		return &unavailableError{op: op, endpoints: strings.Join(s.endpoints, ","), lost: lost, err: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// unreachable reports whether err says etcd did not answer in time or
// cannot answer now. The etcd client waits for a connection for as long as
// the call's context lasts (gRPC's WaitForReady), so an etcd that is down
// or cut off shows as the context's deadline; one without a leader
// answers with errors of its own.
func unreachable(err error) bool {
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrTimeout),
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail), errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost),
		errors.Is(err, rpctypes.ErrLeaderChanged), errors.Is(err, rpctypes.ErrTimeoutWaitAppliedIndex):
		return true
	}
	code := status.Code(err)
	return code == codes.Unavailable || code == codes.DeadlineExceeded
}

// unavailableError is an operation etcd did not answer in time.
// errors.Is(err, catalog.ErrUnavailable) holds, and so does it for the
// error it wraps (e.g. context.DeadlineExceeded).
type unavailableError struct {
	op        string
	endpoints string
	lost      int // compare-and-swap attempts lost to concurrent writers first
	err       error
}

func (e *unavailableError) Error() string {
	if e.lost > 0 { // etcd answered, but others wrote the record meanwhile
		return fmt.Sprintf("catalog: etcd busy: %s: %d attempts lost to concurrent changes, then no answer from %s in time: %v", e.op, e.lost, e.endpoints, e.err)
	}
	return fmt.Sprintf("catalog: etcd unreachable: %s: no answer from %s in time: %v", e.op, e.endpoints, e.err)
}

func (e *unavailableError) Is(target error) bool { return target == catalog.ErrUnavailable }
func (e *unavailableError) Unwrap() error        { return e.err }

// Put implements Registrar.
func (s *Store) Put(ctx context.Context, w catalog.Worker, lease catalog.LeaseID) (int64, error) {
	b, err := catalog.EncodeRecord(w)
	if err != nil {
		return 0, err
	}
	op := fmt.Sprintf("put %v lease %x", w.Key(), lease)
	for lost := range catalog.MaxUpdateAttempts {
		st, err := s.read(ctx, w.Key())
		if err != nil {
			return 0, s.etcdErrAfter(op, lost, err)
		}
		rev, ok, err := s.commit(ctx, st, b, lease, false)
		if err != nil || ok {
			return rev, s.wrapOp(op, lost, err)
		}
	}
	return 0, fmt.Errorf("%s: %w", op, catalog.ErrContended)
}

// Update implements Store.
func (s *Store) Update(ctx context.Context, k catalog.Key, fn catalog.UpdateFunc) (int64, error) {
	op := fmt.Sprintf("update %v", k)
	for lost := range catalog.MaxUpdateAttempts {
		st, err := s.read(ctx, k)
		if err != nil {
			return 0, s.etcdErrAfter(op, lost, err)
		}
		w, cur, err := st.current(s.prefix)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", op, err)
		}
		var b []byte
		switch err := fn(&w, cur); {
		case errors.Is(err, catalog.RemoveRecord) && !cur.Exists:
			return 0, fmt.Errorf("%s: %w", op, catalog.ErrNotFound)
		case errors.Is(err, catalog.RemoveRecord):
		case err != nil:
			return 0, err
		case w.Key() != k:
			return 0, fmt.Errorf("%s: the update moved the record to %v", op, w.Key())
		default:
			if b, err = catalog.EncodeRecord(w); err != nil {
				return 0, err
			}
		}
		rev, ok, err := s.commit(ctx, st, b, cur.Lease, true)
		if err != nil || ok {
			return rev, s.wrapOp(op, lost, err)
		}
	}
	return 0, fmt.Errorf("%s: %w", op, catalog.ErrContended)
}

func (s *Store) wrapOp(op string, lost int, err error) error {
	var inUse *catalog.IDInUseError
	if err == nil || errors.As(err, &inUse) {
		return err
	}
	return s.etcdErrAfter(op, lost, err)
}

// keyState is what a write read: the record and its id claim, and the
// record the claim names when that is another one.
type keyState struct {
	k           catalog.Key
	path, claim string
	rec         *mvccpb.KeyValue // nil: no record
	claimRev    int64            // 0: no claim
	holder      string           // the path another record claims the id with; "" if none
	holderKV    *mvccpb.KeyValue // that record, nil if it is gone (the claim is stale)
}

// read reads k's record and claim at one revision.
func (s *Store) read(ctx context.Context, k catalog.Key) (keyState, error) {
	st := keyState{k: k, path: k.Path(s.prefix), claim: catalog.IDClaimPath(s.prefix, k.WorkerID)}
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(st.path), clientv3.OpGet(st.claim)).Commit()
	if err != nil {
		return st, err
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		st.rec = kvs[0]
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		st.claimRev = kvs[0].ModRevision
		if v := string(kvs[0].Value); v != st.path {
			st.holder = v
			hr, err := s.cli.Get(ctx, v)
			if err != nil {
				return st, err
			}
			if len(hr.Kvs) > 0 {
				st.holderKV = hr.Kvs[0]
			}
		}
	}
	return st, nil
}

// current decodes the record read, for an UpdateFunc.
func (st keyState) current(prefix string) (catalog.Worker, catalog.Current, error) {
	if st.rec == nil {
		return catalog.Worker{ModelName: st.k.Model, RoutingGroup: st.k.Group, WorkerID: st.k.WorkerID}, catalog.Current{}, nil
	}
	rec := catalog.DecodeRecord(prefix, st.path, st.rec.Value, false, st.rec.ModRevision, catalog.LeaseID(st.rec.Lease))
	if rec.Err != nil {
		return catalog.Worker{}, catalog.Current{}, fmt.Errorf("stored record is bad: %w", rec.Err)
	}
	return rec.Worker, catalog.Current{Exists: true, Lease: rec.Lease, ModRevision: rec.ModRevision}, nil
}

// inUse returns the error for a write of st's key while another record
// holds the id, or nil.
func (st keyState) inUse(prefix string) error {
	if st.holderKV == nil {
		return nil
	}
	hk, err := catalog.ParseKey(prefix, st.holder)
	if err != nil {
		return nil // not a record key: a stale claim to take over
	}
	return &catalog.IDInUseError{ID: st.k.WorkerID, Holder: hk, Lease: catalog.LeaseID(st.holderKV.Lease)}
}

// commit writes value (nil: deletes the record) with lease if nothing it
// read has changed (the record too when checkRecord), and reports
// whether it did; false means try again.
func (s *Store) commit(ctx context.Context, st keyState, value []byte, lease catalog.LeaseID, checkRecord bool) (int64, bool, error) {
	var cmps []clientv3.Cmp
	if checkRecord {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(st.path), "=", modRev(st.rec)))
	}
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(st.claim), "=", st.claimRev))
	var ops []clientv3.Op
	if value == nil {
		ops = append(ops, clientv3.OpDelete(st.path))
		if st.claimRev != 0 && st.holder == "" {
			ops = append(ops, clientv3.OpDelete(st.claim))
		}
	} else {
		if err := st.inUse(s.prefix); err != nil {
			return 0, false, err
		}
		if st.holder != "" { // a stale claim: its record must still be gone
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(st.holder), "=", 0))
		}
		var opts []clientv3.OpOption
		if lease != catalog.NoLease {
			opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
		}
		ops = append(ops, clientv3.OpPut(st.claim, st.path, opts...), clientv3.OpPut(st.path, string(value), opts...))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, false, err
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

func modRev(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// Get implements Store.
func (s *Store) Get(ctx context.Context, k catalog.Key) (catalog.Worker, error) {
	path := k.Path(s.prefix)
	resp, err := s.cli.Get(ctx, path)
	if err != nil {
		return catalog.Worker{}, s.etcdErr(fmt.Sprintf("get %v", k), err)
	}
	if len(resp.Kvs) == 0 {
		return catalog.Worker{}, fmt.Errorf("get %v: %w", k, catalog.ErrNotFound)
	}
	kv := resp.Kvs[0]
	rec := catalog.DecodeRecord(s.prefix, path, kv.Value, false, kv.ModRevision, catalog.LeaseID(kv.Lease))
	if rec.Err != nil {
		return catalog.Worker{}, fmt.Errorf("get %v: %w", k, rec.Err)
	}
	return rec.Worker, nil
}

// Delete implements Store: the record and, if it names this record, its
// id claim, in one transaction.
func (s *Store) Delete(ctx context.Context, k catalog.Key) (bool, error) {
	op := fmt.Sprintf("delete %v", k)
	for lost := range catalog.MaxUpdateAttempts {
		st, err := s.read(ctx, k)
		if err != nil {
			return false, s.etcdErrAfter(op, lost, err)
		}
		if st.rec == nil {
			return false, nil
		}
		_, ok, err := s.commit(ctx, st, nil, catalog.NoLease, true)
		if err != nil {
			return false, s.etcdErrAfter(op, lost, err)
		}
		if ok {
			return true, nil
		}
	}
	return false, fmt.Errorf("%s: %w", op, catalog.ErrContended)
}

// Keys implements Store.
func (s *Store) Keys(ctx context.Context, model string, id uint64) ([]catalog.Key, error) {
	resp, err := s.cli.Get(ctx, catalog.ModelPrefix(s.prefix, model), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, s.etcdErr(fmt.Sprintf("keys of worker %d in model %q", id, clip.String(model)), err)
	}
	var out []catalog.Key
	for _, kv := range resp.Kvs {
		if k, err := catalog.ParseKey(s.prefix, string(kv.Key)); err == nil && k.WorkerID == id {
			out = append(out, k)
		}
	}
	return out, nil
}

// List implements WatchSource. It reads in pages, all at the revision of
// the first page.
func (s *Store) List(ctx context.Context, rev int64) (catalog.Snapshot, error) {
	wp := catalog.WorkersPrefix(s.prefix)
	end := clientv3.GetPrefixRangeEnd(wp)
	from := wp
	snap := catalog.Snapshot{Revision: rev}
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if snap.Revision > 0 {
			opts = append(opts, clientv3.WithRev(snap.Revision))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return catalog.Snapshot{}, s.etcdErr(fmt.Sprintf("list %s at revision %d", wp, snap.Revision), err)
		}
		if snap.Revision == 0 {
			snap.Revision = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			snap.Records = append(snap.Records, catalog.DecodeRecord(s.prefix, string(kv.Key), kv.Value, false, kv.ModRevision, catalog.LeaseID(kv.Lease)))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return snap, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Compact compacts etcd's history below rev (the whole keyspace, not only
// the prefix). Used by tests; production etcd compacts on its own
// schedule.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if _, err := s.cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return s.etcdErr(fmt.Sprintf("compact at revision %d", rev), err)
	}
	return nil
}

// Grant implements Registrar.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (catalog.LeaseID, error) {
	resp, err := s.cli.Grant(ctx, catalog.TTLSeconds(ttl))
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("grant lease of %v", ttl), err)
	}
	return catalog.LeaseID(resp.ID), nil
}

// KeepAliveOnce implements Registrar.
func (s *Store) KeepAliveOnce(ctx context.Context, id catalog.LeaseID) (time.Duration, error) {
	resp, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(id))
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("keep lease %x alive", id), err)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Revoke implements Registrar.
func (s *Store) Revoke(ctx context.Context, id catalog.LeaseID) error {
	if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
		return s.etcdErr(fmt.Sprintf("revoke lease %x", id), err)
	}
	return nil
}

// Watch implements WatchSource. The etcd client resumes a watch by itself
// after a reconnect, but a restarted etcd may have lost or compacted the
// history it resumes from; so the stream also follows the client's
// connection and reports ErrInterrupted when it drops, which makes a
// Watcher list again and diff. As the connection state can stay READY
// through a short outage, the stream also reads etcd's header every
// WatchCheckInterval and reports ErrInterrupted after a failed read, a
// different cluster id or a revision below the one the watch started at. It requires a leader: a member cut off from
// its cluster fails the watch (ErrInterrupted) instead of going quiet.
func (s *Store) Watch(ctx context.Context, rev int64) (catalog.WatchStream, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	conn := s.cli.ActiveConnection()
	state := conn.GetState()
	w := &etcdWatch{
		s:           s,
		from:        rev,
		cancel:      cancel,
		wch:         s.cli.Watch(wctx, catalog.WorkersPrefix(s.prefix), opts...),
		interrupted: make(chan struct{}),
	}
	w.wg.Add(2)
	go func() { // owned by the stream: Close waits for it
		defer w.wg.Done()
		w.follow(wctx, conn, state)
	}()
	go func() {
		defer w.wg.Done()
		w.check(wctx, rev-1)
	}()
	return w, nil
}

// check closes w.interrupted when etcd was unreachable for a header read
// and is back, or is not the cluster, or not the history, it was. listed
// is the revision of the list the watch continues (0: unknown): an etcd
// below it lost that history, even if it restarted before the watch began.
func (w *etcdWatch) check(ctx context.Context, listed int64) {
	every := w.s.watchCheck
	if every <= 0 {
		every = WatchCheckInterval
	}
	header := func() (cluster uint64, rev int64, err error) {
		rctx, cancel := context.WithTimeout(ctx, every)
		defer cancel()
		resp, err := w.s.cli.Get(rctx, catalog.WorkersPrefix(w.s.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, 0, err
		}
		return resp.Header.ClusterId, resp.Header.Revision, nil
	}
	cluster, base, err := header()
	failed := err != nil
	if err == nil && base < listed {
		w.interrupt()
		return
	}
	base = max(base, listed)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, rev, err := header()
		switch {
		case err != nil:
			failed = ctx.Err() == nil
			if failed {
				w.s.checkFailures.Add(1)
			}
		case failed || (cluster != 0 && c != cluster) || rev < base:
			w.interrupt()
			return
		}
	}
}

func (w *etcdWatch) interrupt() { w.once.Do(func() { close(w.interrupted) }) }

type etcdWatch struct {
	s           *Store
	from        int64 // next revision expected (for errors)
	cancel      context.CancelFunc
	wch         clientv3.WatchChan
	interrupted chan struct{} // closed (once, by interrupt) when the connection drops after being ready
	once        sync.Once
	wg          sync.WaitGroup
}

// follow closes w.interrupted once the client connection leaves the ready
// state, having been ready during the watch.
func (w *etcdWatch) follow(ctx context.Context, conn *grpc.ClientConn, state connectivity.State) {
	ready := state == connectivity.Ready
	for conn.WaitForStateChange(ctx, state) {
		state = conn.GetState()
		if state == connectivity.Ready {
			ready = true
			continue
		}
		if ready {
			w.interrupt()
			return
		}
	}
}

func (w *etcdWatch) Close() {
	w.cancel()
	w.wg.Wait()
}

func (w *etcdWatch) Next(ctx context.Context) ([]catalog.Event, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.interrupted:
			return nil, fmt.Errorf("watch from revision %d: connection to etcd lost: %w", w.from, catalog.ErrInterrupted)
		case resp, ok := <-w.wch:
			if !ok {
				return nil, fmt.Errorf("watch from revision %d: closed: %w", w.from, catalog.ErrInterrupted)
			}
			if err := resp.Err(); err != nil {
				switch {
				case resp.CompactRevision != 0:
					return nil, fmt.Errorf("watch from revision %d (compacted at %d): %w: %w", w.from, resp.CompactRevision, catalog.ErrCompacted, err)
				case errors.Is(err, rpctypes.ErrNoLeader):
					return nil, fmt.Errorf("watch from revision %d: %w: %w", w.from, catalog.ErrInterrupted, err)
				}
				return nil, fmt.Errorf("watch from revision %d: %w", w.from, err)
			}
			if len(resp.Events) == 0 {
				continue // progress notification
			}
			evs := make([]catalog.Event, len(resp.Events))
			for i, e := range resp.Events {
				kv := e.Kv
				if e.Type == mvccpb.DELETE {
					evs[i] = catalog.Event{Type: catalog.EventDelete, Record: catalog.DecodeRecord(w.s.prefix, string(kv.Key), nil, true, kv.ModRevision, catalog.NoLease)}
				} else {
					evs[i] = catalog.Event{Type: catalog.EventPut, Record: catalog.DecodeRecord(w.s.prefix, string(kv.Key), kv.Value, false, kv.ModRevision, catalog.LeaseID(kv.Lease))}
				}
			}
			w.from = resp.Events[len(resp.Events)-1].Kv.ModRevision + 1
			return evs, nil
		}
	}
}
