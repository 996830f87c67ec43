package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// DefaultSessionTTL is the lease TTL of a Session registered with ttl 0.
const DefaultSessionTTL = 10 * time.Second

// Session is a lease-backed registration of one worker record, shaped
// like etcd's concurrency.Session: the record is written with a lease
// that Run keeps alive; when the lease is lost (etcd down for longer than
// the TTL, or the lease revoked) Done's channel closes, and Run registers
// the same record again with a new lease as soon as the store takes
// writes. Close revokes the lease, so the record disappears at once. If
// the process dies instead, the record disappears when the TTL runs out.
//
// Methods are safe for concurrent use; Run is called once.
type Session struct {
	reg    Registrar
	logger *slog.Logger

	putMu sync.Mutex // serialises Puts of the record (Update, re-registration)

	mu        sync.Mutex // guards the fields below
	w         Worker
	ttl       time.Duration // last TTL the store reported
	lease     LeaseID
	renewed   time.Time     // when the last successful renewal (or grant) was sent
	lost      chan struct{} // closed when lease is lost
	lostShut  bool          // lost is closed
	closed    bool
	closing   chan struct{} // closed by Close
	onRenewal func(LeaseID) // OnRenewal; may be nil
}

// SessionOption configures Register.
type SessionOption func(*Session)

// WithLogger sets where a Session logs lease loss and re-registration
// (default slog.Default()).
func WithLogger(l *slog.Logger) SessionOption {
	return func(s *Session) { s.logger = l }
}

// OnRenewal makes a Session call f with its lease after each successful
// renewal, on Run's goroutine (f must not block).
func OnRenewal(f func(LeaseID)) SessionOption {
	return func(s *Session) { s.onRenewal = f }
}

// Register validates w (apply WithDefaults first), grants a lease of ttl
// (DefaultSessionTTL if 0) and writes w with it. The registration lasts
// one TTL unless Run keeps it alive. A bad record or an unreachable store
// is an error here.
func Register(ctx context.Context, reg Registrar, w Worker, ttl time.Duration, opts ...SessionOption) (*Session, error) {
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("register %v: %w", w.Key(), err)
	}
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	ttl = time.Duration(TTLSeconds(ttl)) * time.Second
	s := &Session{reg: reg, logger: slog.Default(), w: w, ttl: ttl, closing: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	lease, sent, err := s.grantAndPut(ctx, w)
	if err != nil {
		return nil, fmt.Errorf("register %v: %w", w.Key(), err)
	}
	s.lease, s.renewed, s.lost = lease, sent, make(chan struct{})
	return s, nil
}

// grantAndPut writes w with a new lease, revoking the lease if the write
// fails. It returns when the grant was sent.
func (s *Session) grantAndPut(ctx context.Context, w Worker) (LeaseID, time.Time, error) {
	sent := time.Now()
	lease, err := s.reg.Grant(ctx, s.ttl)
	if err != nil {
		return 0, sent, err
	}
	s.putMu.Lock()
	_, err = s.reg.Put(ctx, w, lease)
	s.putMu.Unlock()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ttl)
		_ = s.reg.Revoke(rctx, lease) // best effort: it expires anyway
		cancel()
		return 0, sent, err
	}
	return lease, sent, nil
}

// Lease returns the lease the record is currently written with.
func (s *Session) Lease() LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// Worker returns the registered record.
func (s *Session) Worker() Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w
}

// Done returns a channel that is closed when the current lease is lost
// (expired, revoked, or not renewed within its TTL) or the session is
// closed. After Run re-registers, Done returns a new channel.
func (s *Session) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// Update writes a changed record (e.g. lifecycle draining) with the
// current lease; later re-registrations write it too. Its Key must not
// change.
func (s *Session) Update(ctx context.Context, w Worker) error {
	if err := w.Validate(); err != nil {
		return fmt.Errorf("update %v: %w", w.Key(), err)
	}
	s.mu.Lock()
	if s.w.Key() != w.Key() {
		k := s.w.Key()
		s.mu.Unlock()
		return fmt.Errorf("update %v: the session registers %v; a record cannot move", w.Key(), k)
	}
	lease := s.lease
	s.mu.Unlock()
	s.putMu.Lock()
	defer s.putMu.Unlock()
	if _, err := s.reg.Put(ctx, w, lease); err != nil {
		return fmt.Errorf("update %v: %w", w.Key(), err)
	}
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
	return nil
}

// Run keeps the registration present until ctx ends or Close is called:
// it renews the lease every third of its TTL (retrying failed renewals
// until the TTL since the last success has passed), and when the lease is
// lost it closes Done's channel and registers again with a new lease,
// retrying with backoff while the store is unreachable. It returns ctx's
// error, or nil after Close. Ending Run without Close leaves the record
// to expire with its lease, as a crashed registrant would.
func (s *Session) Run(ctx context.Context) error {
	for {
		s.mu.Lock()
		lease := s.lease
		s.mu.Unlock()
		err := s.keepAlive(ctx, lease)
		if stop, rerr := s.stopped(ctx); stop {
			return rerr
		}
		s.markLost(lease)
		w := s.Worker() // Update may change s.w meanwhile
		s.logger.Warn("catalog: registration lease lost; registering again", "worker", w.WorkerID, "model", w.ModelName, "group", w.RoutingGroup, "lease", fmt.Sprintf("%x", lease), "err", err)
		if err := s.reregister(ctx, lease); err != nil {
			_, rerr := s.stopped(ctx)
			return rerr
		}
	}
}

// stopped reports whether Run should return, and what.
func (s *Session) stopped(ctx context.Context) (bool, error) {
	select {
	case <-s.closing:
		return true, nil
	default:
	}
	if ctx.Err() != nil {
		return true, ctx.Err()
	}
	return false, nil
}

// keepAlive renews lease until it is lost (returning why), ctx ends or
// the session closes.
func (s *Session) keepAlive(ctx context.Context, lease LeaseID) error {
	s.mu.Lock()
	ttl, renewed := s.ttl, s.renewed
	s.mu.Unlock()
	deadline := renewed.Add(ttl)
	timer := time.NewTimer(time.Until(renewed.Add(ttl / 3)))
	defer timer.Stop()
	bo := retry.Backoff(100*time.Millisecond, time.Second)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return nil
		case <-timer.C:
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("lease %x not renewed within its TTL %v", lease, ttl)
		}
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, min(ttl/3, left))
		got, err := s.reg.KeepAliveOnce(actx, lease)
		cancel()
		if err == nil {
			ttl, deadline = got, sent.Add(got)
			s.mu.Lock()
			s.ttl, s.renewed = got, sent
			hook := s.onRenewal
			s.mu.Unlock()
			if hook != nil {
				hook(lease)
			}
			bo.Reset()
			timer.Reset(ttl / 3)
			continue
		}
		if errors.Is(err, ErrLeaseNotFound) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Transient (store unreachable): try again soon, until the deadline.
		timer.Reset(min(bo.NextBackOff(), max(time.Until(deadline), 0)))
	}
}

// markLost closes the lost channel of lease if it is still current.
func (s *Session) markLost(lease LeaseID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease == lease && !s.lostShut {
		close(s.lost)
		s.lostShut = true
	}
}

// reregister writes the record again with a new lease, retrying until it
// succeeds, ctx ends or the session closes.
func (s *Session) reregister(ctx context.Context, old LeaseID) error {
	bo := retry.Backoff(100*time.Millisecond, time.Second)
	for attempt := 1; ; attempt++ {
		s.mu.Lock()
		w, ttl := s.w, s.ttl
		s.mu.Unlock()
		actx, cancel := context.WithTimeout(ctx, ttl)
		lease, sent, err := s.grantAndPut(actx, w)
		cancel()
		if err == nil {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
				_ = s.reg.Revoke(rctx, lease) // Close revoked the old one; this one too
				cancel()
				return errors.New("session closed")
			}
			s.lease, s.renewed, s.lost, s.lostShut = lease, sent, make(chan struct{}), false
			s.mu.Unlock()
			s.logger.Info("catalog: registered again", "worker", w.WorkerID, "model", w.ModelName, "group", w.RoutingGroup, "lease", fmt.Sprintf("%x", lease), "attempts", attempt)
			// The old lease no longer holds the record; end it if the
			// store still has it.
			rctx, cancel := context.WithTimeout(ctx, ttl)
			_ = s.reg.Revoke(rctx, old)
			cancel()
			return nil
		}
		if stop, rerr := s.stopped(ctx); stop {
			return rerr
		}
		s.logger.Debug("catalog: register again failed", "worker", w.WorkerID, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return errors.New("session closed")
		case <-time.After(bo.NextBackOff()):
		}
	}
}

// Close revokes the lease, deleting the record at once, and makes Run
// return. It may be called while Run runs or after it returned; later
// calls do nothing. Revocation is bounded by the TTL.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	lease, ttl, w := s.lease, s.ttl, s.w
	if !s.lostShut {
		close(s.lost)
		s.lostShut = true
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	if err := s.reg.Revoke(ctx, lease); err != nil && !errors.Is(err, ErrLeaseNotFound) {
		return fmt.Errorf("unregister %v: %w", w.Key(), err)
	}
	return nil
}
