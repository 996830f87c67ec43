package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// Defaults of Config.
const (
	DefaultLeaseTTL = 10 * time.Second
	DefaultResync   = 30 * time.Second
	// maxSnapshot bounds the bookings a subscriber takes from one
	// snapshot; beyond it they are dropped and counted.
	maxSnapshot = 1 << 20
)

// The sync service, without protobuf: one server-streaming method.
const (
	serviceName   = "prefixd.replica.v1.Sync"
	subscribePath = "/" + serviceName + "/Subscribe"
)

var subscribeDesc = grpc.StreamDesc{StreamName: "Subscribe", ServerStreams: true}

// Config configures a Sync.
type Config struct {
	// ID names this replica: its record's id and its deltas' Origin
	// (coordinator.ServiceConfig.Origin). Required.
	ID string
	// Advertise is the host:port peers dial (the record's sync_address).
	// Required.
	Advertise string
	// Listener serves the sync stream. Required; Run closes it.
	Listener net.Listener
	// Service is this replica's coordinator: the snapshot source and
	// where peers' deltas go. Its OnBooking must be Hub.Booked.
	Service *coordinator.Service
	Hub     *Hub
	// Store keeps the replica records.
	Store catalog.ReplicaStore
	// LeaseTTL is the record's lease (default DefaultLeaseTTL): a replica
	// killed without a word leaves its peers within it.
	LeaseTTL time.Duration
	// Resync lists the replicas again this often, besides the watch
	// (default DefaultResync).
	Resync time.Duration
	Logger *slog.Logger
	// Synced, if set, holds back following peers until it is closed
	// (the daemon: its catalog watch delivered the first list), so that
	// their snapshots land on workers this replica knows; a booking on a
	// worker it does not know is refused.
	Synced <-chan struct{}
	// Applied, if set, is called after each message from a peer is
	// applied, with the last Seq seen from it (tests and benchmarks).
	Applied func(peer string, seq uint64)
}

// Sync shares this replica's bookings with its peers and applies
// theirs. Its methods are safe for concurrent use.
type Sync struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex // guards followers, connected, streams
	followers map[string]*follower
	connected map[string]bool   // a stream from the peer is synced
	streams   map[string]uint64 // streams synced, by peer
}

type follower struct {
	rec    catalog.Replica
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Sync; Run starts it.
func New(cfg Config) (*Sync, error) {
	switch {
	case cfg.ID == "":
		return nil, errors.New("replica sync: no replica id")
	case cfg.Listener == nil || cfg.Service == nil || cfg.Hub == nil || cfg.Store == nil:
		return nil, errors.New("replica sync: listener, service, hub and store are required")
	}
	rec := catalog.Replica{Version: catalog.RecordVersion, ID: cfg.ID, SyncAddress: cfg.Advertise, StartedAt: time.Now().UTC()}
	if err := rec.Validate(); err != nil {
		return nil, fmt.Errorf("replica sync: %w", err)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sync{cfg: cfg, log: cfg.Logger, followers: map[string]*follower{}, connected: map[string]bool{}, streams: map[string]uint64{}}, nil
}

// Run registers the replica, serves its stream, and follows every peer
// in the catalog until ctx ends. On return its record is revoked (peers
// drop its bookings at once), its streams closed and its peers' bookings
// dropped.
func (s *Sync) Run(ctx context.Context) error {
	srv := grpc.NewServer(grpc.ForceServerCodecV2(codec{}), grpc.MaxRecvMsgSize(64<<10), grpc.MaxSendMsgSize(MaxMessageBytes))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: serviceName, HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Subscribe", ServerStreams: true, Handler: func(_ any, st grpc.ServerStream) error { return s.serve(ctx, st) }}}}, nil)
	rec := catalog.Replica{Version: catalog.RecordVersion, ID: s.cfg.ID, SyncAddress: s.cfg.Advertise, StartedAt: time.Now().UTC()}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(s.cfg.Listener); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("replica sync serve %s: %w", s.cfg.Listener.Addr(), err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		srv.Stop() // the streams' handlers have returned or return now: nothing to drain
		return nil
	})
	g.Go(func() error { return catalog.KeepReplica(gctx, s.cfg.Store, rec, s.cfg.LeaseTTL, s.log) })
	g.Go(func() error { return s.discover(gctx) })
	s.log.Info("replica sync serving", "replica", s.cfg.ID, "listen", s.cfg.Listener.Addr().String(), "advertise", s.cfg.Advertise, "lease_ttl", s.cfg.LeaseTTL)
	err := g.Wait()
	s.reconcile(nil, true) // stop following, drop every peer's bookings
	s.log.Info("replica sync stopped: record revoked, peers' bookings dropped", "replica", s.cfg.ID)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// serve is one subscriber's stream: a snapshot, then deltas as they
// come, until the subscriber leaves, falls behind or ctx ends.
func (s *Sync) serve(ctx context.Context, st grpc.ServerStream) error {
	var h Hello
	if err := st.RecvMsg(&h); err != nil {
		return err
	}
	var sub *subscriber
	var seq uint64
	var live []coordinator.BookingDelta
	s.cfg.Service.SnapshotBookings(func(sq uint64, l []coordinator.BookingDelta) {
		seq, live = sq, l
		sub = s.cfg.Hub.add(h.Replica)
	})
	defer s.cfg.Hub.remove(sub)
	if err := s.send(st, sub.peer, KindSnapshot, seq, live); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-st.Context().Done():
			return nil
		case <-sub.ready:
		}
		ds, overflow := s.cfg.Hub.take(sub)
		if overflow {
			return status.Errorf(codes.ResourceExhausted, "subscriber %q fell %d deltas behind: resubscribe", clip.String(h.Replica), s.cfg.Hub.size)
		}
		if err := s.send(st, sub.peer, KindLive, 0, ds); err != nil {
			return err
		}
	}
}

// send sends ds in messages of at most MaxBatch deltas and about half
// of MaxMessageBytes; a snapshot ends with a message marked Last.
func (s *Sync) send(st grpc.ServerStream, peer string, kind Kind, seq uint64, ds []coordinator.BookingDelta) error {
	if kind == KindLive && len(ds) == 0 {
		return nil // a wake-up whose deltas an earlier take sent
	}
	for first := true; first || len(ds) > 0; first = false {
		n, size := 0, 0
		for n < len(ds) && n < MaxBatch {
			d := &ds[n]
			if len(d.Blocks) > MaxBlocks {
				d.Blocks = d.Blocks[:MaxBlocks] // the prefix: a receiver refuses more
			}
			sz := 64 + len(d.ID) + len(d.Pool.Model) + len(d.Pool.Group) + 9*len(d.Blocks)
			if n > 0 && size+sz > MaxMessageBytes/2 {
				break
			}
			size += sz
			n++
		}
		b := Batch{Origin: s.cfg.ID, Kind: kind, Seq: seq, Last: kind == KindSnapshot && n == len(ds), Deltas: ds[:n]}
		if err := st.SendMsg(&b); err != nil {
			return err
		}
		s.cfg.Hub.countSent(peer, n)
		ds = ds[n:]
	}
	return nil
}

// discover follows the replica records: the watch, and a list every
// Resync, each reconciled with the peers followed.
func (s *Sync) discover(ctx context.Context) error {
	if s.cfg.Synced != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-s.cfg.Synced:
		}
	}
	bo := retry.Backoff(100*time.Millisecond, s.cfg.Resync)
	tick := time.NewTicker(s.cfg.Resync)
	defer tick.Stop()
	var changed <-chan struct{}
	stopWatch := func() {}
	defer func() { stopWatch() }()
	for {
		snap, err := s.cfg.Store.Replicas(ctx)
		wait := (<-chan time.Time)(nil)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d := bo.NextBackOff()
			s.log.Warn("replica records not listed; retrying", "in", d.Round(time.Millisecond), "err", err)
			wait = time.After(d)
		} else {
			bo.Reset()
			s.reconcile(snap.Replicas, false)
			if changed == nil {
				wctx, cancel := context.WithCancel(ctx)
				stopWatch = cancel
				changed = s.cfg.Store.WatchReplicas(wctx, snap.Revision+1)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-changed:
			if !ok {
				stopWatch()
				changed = nil
			}
		case <-tick.C:
		case <-wait:
		}
	}
}

// reconcile follows every replica of recs but this one, and stops
// following (dropping their bookings) those no longer there or whose
// record changed (a restart: a new started_at, or a new address). When
// this replica stops, it stops following everyone.
func (s *Sync) reconcile(recs []catalog.Replica, stopping bool) {
	want := map[string]catalog.Replica{}
	for _, r := range recs {
		if r.ID != s.cfg.ID {
			want[r.ID] = r
		}
	}
	s.mu.Lock()
	var stop []*follower
	for id, f := range s.followers {
		if r, ok := want[id]; !ok || r != f.rec {
			stop = append(stop, f)
			delete(s.followers, id)
			delete(s.connected, id)
		}
	}
	s.mu.Unlock()
	for _, f := range stop {
		f.cancel()
		<-f.done
		n := s.cfg.Service.DropPeer(f.rec.ID)
		if !stopping {
			s.log.Info("replica peer left: its bookings dropped", "peer", f.rec.ID, "sync_address", f.rec.SyncAddress, "bookings_dropped", n)
		}
	}
	if stopping {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range want {
		if _, ok := s.followers[id]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		f := &follower{rec: r, cancel: cancel, done: make(chan struct{})}
		s.followers[id] = f
		s.log.Info("replica peer joined", "peer", id, "sync_address", r.SyncAddress, "started_at", r.StartedAt)
		go func() { // owned by reconcile: stopped and waited for there (Run's end stops all)
			defer close(f.done)
			s.follow(ctx, r)
		}()
	}
}

// follow subscribes to peer r until ctx ends, reconnecting with backoff.
func (s *Sync) follow(ctx context.Context, r catalog.Replica) {
	conn, err := grpc.NewClient(r.SyncAddress, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec{}), grpc.MaxCallRecvMsgSize(MaxMessageBytes)))
	if err != nil { // only a malformed target, which Validate rules out
		s.log.Error("replica peer not followed", "peer", r.ID, "sync_address", r.SyncAddress, "err", err)
		return
	}
	defer conn.Close()
	bo := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for failures := 0; ; failures++ {
		synced, err := s.stream(ctx, conn, r)
		s.setConnected(r.ID, false)
		if ctx.Err() != nil {
			return
		}
		if synced {
			bo.Reset()
			failures = 0
		}
		d := bo.NextBackOff()
		// The first failure is news; the retries until the peer is back
		// (or its record expires) are not.
		lvl := slog.LevelWarn
		if failures > 0 {
			lvl = slog.LevelDebug
		}
		attrs := []any{"peer", r.ID, "sync_address", r.SyncAddress, "in", d.Round(time.Millisecond), "err", err}
		if host, _, _ := net.SplitHostPort(r.SyncAddress); !synced && isLoopback(host) {
			attrs = append(attrs, "hint", "a loopback sync_address is reachable from its own host only: give replicas on other hosts --replica-sync-listen and --replica-advertise")
		}
		s.log.Log(ctx, lvl, "replica peer stream ended; reconnecting", attrs...)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// stream runs one subscription to r: the snapshot replaces what is held
// of r (ResetPeer: a restarted peer, its Seq from 1 again, starts
// clean), then each message is applied as it comes. It reports whether
// the snapshot was applied.
func (s *Sync) stream(ctx context.Context, conn *grpc.ClientConn, r catalog.Replica) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := conn.NewStream(ctx, &subscribeDesc, subscribePath)
	if err != nil {
		return false, err
	}
	if err := cs.SendMsg(&Hello{Replica: s.cfg.ID}); err != nil {
		return false, err
	}
	if err := cs.CloseSend(); err != nil {
		return false, err
	}
	var snap []coordinator.BookingDelta
	synced := false
	for {
		var b Batch
		if err := cs.RecvMsg(&b); err != nil {
			return synced, err
		}
		if b.Origin != r.ID {
			return synced, fmt.Errorf("replica %q at %s answers as %q", r.ID, r.SyncAddress, clip.String(b.Origin))
		}
		switch {
		case b.Kind == KindSnapshot && !synced:
			snap = append(snap, b.Deltas[:min(len(b.Deltas), maxSnapshot-len(snap))]...)
			if !b.Last {
				continue
			}
			applied, dropped := s.cfg.Service.ResetPeer(r.ID, b.Seq, snap)
			snap, synced = nil, true
			s.setConnected(r.ID, true)
			s.log.Info("replica peer synced", "peer", r.ID, "bookings", applied, "refused", dropped, "seq", b.Seq)
			s.applied(r.ID, b.Seq)
		case b.Kind == KindLive && synced:
			if len(b.Deltas) == 0 {
				continue
			}
			s.cfg.Service.ApplyPeer(b.Deltas)
			s.applied(r.ID, b.Deltas[len(b.Deltas)-1].Seq)
		default:
			return synced, fmt.Errorf("replica %q: a message of kind %d out of place", r.ID, b.Kind)
		}
	}
}

func (s *Sync) applied(peer string, seq uint64) {
	if s.cfg.Applied != nil {
		s.cfg.Applied(peer, seq)
	}
}

func (s *Sync) setConnected(peer string, up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.followers[peer]; !ok {
		return
	}
	s.connected[peer] = up
	if up {
		s.streams[peer]++
	}
}

// Peers returns the peers followed and whether each one's stream is
// synced.
func (s *Sync) Peers() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.followers))
	for id := range s.followers {
		out[id] = s.connected[id]
	}
	return out
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}
