package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// Replica is the record of one running prefixd replica (a `prefixd
// serve`): where its peers reach it to share bookings. It lives under
// <prefix>/replicas/<replica_id>, attached to the replica's lease, so a
// replica that dies without a word is gone when its lease runs out.
type Replica struct {
	Version int `json:"version"`
	// ID names the replica: unique among the replicas of one etcd prefix
	// (default: host name and process id), at most MaxReplicaIDBytes of
	// printable UTF-8.
	ID string `json:"replica_id"`
	// SyncAddress is the host:port of its booking-sync gRPC listener.
	SyncAddress string `json:"sync_address"`
	// StartedAt is when the replica started: a record whose StartedAt
	// changes under the same id is a restarted replica.
	StartedAt time.Time `json:"started_at"`
}

// MaxReplicaIDBytes bounds a replica id.
const MaxReplicaIDBytes = 253

// Validate checks the record and returns a *ValidationError naming each
// bad field, or nil.
func (r Replica) Validate() error {
	var errs []FieldError
	if r.Version != RecordVersion {
		errs = append(errs, versionError(r.Version))
	}
	if r.ID == "" || len(r.ID) > MaxReplicaIDBytes || !printable(r.ID) {
		errs = append(errs, FieldError{"replica_id", fmt.Sprintf("must be 1 to %d bytes of printable UTF-8", MaxReplicaIDBytes)})
	}
	// net/url, not net: the catalog stays free of the network (TestNoIOImports of coordinator).
	if u, err := url.Parse("tcp://" + r.SyncAddress); err != nil || u.Host != r.SyncAddress || u.Hostname() == "" || u.Port() == "" {
		errs = append(errs, FieldError{"sync_address", fmt.Sprintf("%q is not a host:port", clip.String(r.SyncAddress))})
	} else if p, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || p == 0 {
		errs = append(errs, FieldError{"sync_address", fmt.Sprintf("port %q is not 1 to 65535", clip.String(u.Port()))})
	}
	if r.StartedAt.IsZero() {
		errs = append(errs, FieldError{"started_at", "must be set"})
	}
	if len(errs) == 0 {
		return nil
	}
	return &ValidationError{Fields: errs}
}

// ReplicasPrefix is the prefix every replica key starts with; it is
// outside WorkersPrefix, so the worker watch never sees replicas.
func ReplicasPrefix(prefix string) string { return NormPrefix(prefix) + "/replicas/" }

// ReplicaPath is the store key of replica id: ReplicasPrefix and the id,
// path-escaped.
func ReplicaPath(prefix, id string) string { return ReplicasPrefix(prefix) + url.PathEscape(id) }

// ParseReplicaPath is the inverse of ReplicaPath; it accepts only
// canonical keys.
func ParseReplicaPath(prefix, path string) (string, error) {
	rest, ok := strings.CutPrefix(path, ReplicasPrefix(prefix))
	id, err := url.PathUnescape(rest)
	if !ok || err != nil || id == "" || ReplicaPath(prefix, id) != path {
		return "", fmt.Errorf("key %q is not a canonical replica key", clip.String(path))
	}
	return id, nil
}

// EncodeReplica validates r and encodes it.
func EncodeReplica(r Replica) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("put replica %q: %w", clip.String(r.ID), err)
	}
	return json.Marshal(r)
}

// DecodeReplica parses the record stored under path: valid, and for the
// id its key names.
func DecodeReplica(prefix, path string, data []byte) (Replica, error) {
	id, err := ParseReplicaPath(prefix, path)
	if err != nil {
		return Replica{}, err
	}
	var r Replica
	if err := json.Unmarshal(data, &r); err != nil {
		return Replica{}, fmt.Errorf("replica record %s: %w", clip.String(path), err)
	}
	if err := r.Validate(); err != nil {
		return Replica{}, fmt.Errorf("replica record %s: %w", clip.String(path), err)
	}
	if r.ID != id {
		return Replica{}, fmt.Errorf("replica record %s: body is for replica %q", clip.String(path), clip.String(r.ID))
	}
	return r, nil
}

// ReplicaSnapshot is every good replica record at one revision, sorted
// by id, and how many bad records were skipped.
type ReplicaSnapshot struct {
	Replicas []Replica
	Bad      int
	Revision int64
}

// ReplicaStore keeps replica records (etcdstore.Store implements it).
type ReplicaStore interface {
	// Grant, KeepAliveOnce and Revoke are Registrar's.
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, error)
	KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error)
	Revoke(ctx context.Context, id LeaseID) error
	// PutReplica validates r and writes it under its key, attached to
	// lease (ErrLeaseNotFound if the lease is gone).
	PutReplica(ctx context.Context, r Replica, lease LeaseID) (int64, error)
	// Replicas lists the replica records.
	Replicas(ctx context.Context) (ReplicaSnapshot, error)
	// WatchReplicas returns a channel that receives a value when replica
	// records change at revisions >= rev, and is closed when the watch
	// ends (ctx, or an interrupted watch: list again).
	WatchReplicas(ctx context.Context, rev int64) <-chan struct{}
}

// KeepReplica registers r under a lease of ttl and keeps it until ctx
// ends, then revokes the lease, deleting the record at once. It renews
// the lease every ttl/3; when the lease is lost (etcd was unreachable
// for longer than ttl) or a write fails, it registers again with a new
// lease, retrying with backoff. A process killed without revoking loses
// its record when the lease expires. It returns nil when ctx ends.
func KeepReplica(ctx context.Context, s ReplicaStore, r Replica, ttl time.Duration, log *slog.Logger) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("replica %q: %w", clip.String(r.ID), err)
	}
	bo := retry.Backoff(100*time.Millisecond, ttl)
	lease := NoLease
	defer func() {
		if lease != NoLease {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			if err := s.Revoke(rctx, lease); err != nil {
				log.Warn("replica record not revoked: it goes when its lease expires", "replica", r.ID, "ttl", ttl, "err", err)
			}
		}
	}()
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		if lease == NoLease {
			l, err := s.Grant(ctx, ttl)
			if err == nil {
				if _, err = s.PutReplica(ctx, r, l); err != nil {
					_ = s.Revoke(ctx, l)
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					wait = bo.NextBackOff()
					log.Warn("replica record not registered; retrying", "replica", r.ID, "in", wait.Round(time.Millisecond), "err", err)
				}
				continue
			}
			lease, wait = l, ttl/3
			bo.Reset()
			log.Info("replica registered", "replica", r.ID, "sync_address", r.SyncAddress, "lease", fmt.Sprintf("%x", l), "ttl", ttl)
			continue
		}
		if _, err := s.KeepAliveOnce(ctx, lease); err != nil {
			if errors.Is(err, ErrLeaseNotFound) {
				log.Warn("replica lease lost; registering again", "replica", r.ID, "lease", fmt.Sprintf("%x", lease))
				lease, wait = NoLease, 0
				continue
			}
			wait = min(bo.NextBackOff(), ttl/3)
			continue
		}
		wait = ttl / 3
		bo.Reset()
	}
}
