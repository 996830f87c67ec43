package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// ErrConflict: a registration contradicts the record or partition it
// joins (its block size), or the record is someone else's to change (a
// sidecar's, under a lease). The error is a *ConflictError.
var ErrConflict = errors.New("catalog: registration conflicts")

// ConflictError names the field of a registration that conflicts.
// errors.Is(err, ErrConflict) holds.
type ConflictError struct {
	Field  string // "block_size", "instance_id"
	Reason string
}

func (e *ConflictError) Error() string        { return e.Field + ": " + e.Reason }
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// NotRegisteredError says what UnregisterRanks found not registered.
// errors.Is(err, ErrNotFound) holds.
type NotRegisteredError struct{ Msg string }

func (e *NotRegisteredError) Error() string        { return e.Msg }
func (e *NotRegisteredError) Is(target error) bool { return target == ErrNotFound }

// Registration is what a registrant (POST /register, RegisterRanks) says about one engine
// and one or more consecutive dp ranks of it: the ranks Rank …
// Rank+Size−1, publishing at EventsEndpoint offset per rank as vLLM
// offsets it (OffsetEndpoint), with replay at ReplayEndpoint likewise.
type Registration struct {
	Key                   // model, routing group ("" → DefaultRoutingGroup), worker id
	Rank           uint32 // the first dp rank
	Size           uint32 // 0 means 1; at most MaxDataParallelSize
	EventsEndpoint string // required
	ReplayEndpoint string // optional
	BlockSize      uint32
	Endpoint       string // the engine's HTTP base URL; optional
	Attributes
}

// RegisterRanks writes r into its persistent record (no lease: the API's
// registrations; a sidecar's is Register's session) with the store's
// compare-and-swap:
// a new record, or more ranks for an existing one (a rank registered
// again takes the new endpoints). Ranks may come in any order and leave
// holes, and concurrent registrations of different ranks all land. The
// record's other fields become r's. A record a sidecar keeps under a lease
// is the sidecar's: RegisterRanks refuses it (*ConflictError) rather than
// detach the lease. Errors: *ValidationError (r does not make a valid
// record), *ConflictError, *IDInUseError, or the store's.
func RegisterRanks(ctx context.Context, s Store, r Registration) error {
	if r.Group == "" {
		r.Group = DefaultRoutingGroup
	}
	size := max(r.Size, 1)
	if size > MaxDataParallelSize {
		return invalid("data_parallel_size", "%d exceeds %d", size, MaxDataParallelSize)
	}
	if uint64(r.Rank)+uint64(size) > math.MaxUint32+1 {
		return invalid("dp_rank", "%d + data_parallel_size %d overflows a dp rank", r.Rank, size)
	}
	add, addReplay := make(map[uint32]string, size), make(map[uint32]string, size)
	for i := uint32(0); i < size; i++ {
		ep, err := OffsetEndpoint(r.EventsEndpoint, i)
		if err != nil {
			return invalid("endpoint", "%v", err)
		}
		add[r.Rank+i] = ep
		if r.ReplayEndpoint != "" {
			rp, err := OffsetEndpoint(r.ReplayEndpoint, i)
			if err != nil {
				return invalid("replay_endpoint", "%v", err)
			}
			addReplay[r.Rank+i] = rp
		}
	}
	_, err := s.Update(ctx, r.Key, func(w *Worker, cur Current) error {
		if err := leased(r.Key, cur); err != nil {
			return err
		}
		evs, reps := map[uint32]string{}, map[uint32]string{}
		if cur.Exists {
			if w.BlockSize != r.BlockSize {
				return &ConflictError{"block_size", fmt.Sprintf("%d conflicts with the registered %d", r.BlockSize, w.BlockSize)}
			}
			var err error
			if evs, reps, err = rankEndpoints(*w); err != nil {
				return fmt.Errorf("stored record %v: %w", r.Key, err)
			}
		}
		for rank, ep := range add {
			evs[rank] = ep
			delete(reps, rank)
			if rp, ok := addReplay[rank]; ok {
				reps[rank] = rp
			}
		}
		nw := Worker{WorkerID: r.WorkerID, ModelName: r.Model, RoutingGroup: r.Group, Attributes: r.Attributes,
			Endpoint: r.Endpoint, BlockSize: r.BlockSize}
		setRanks(&nw, evs, reps)
		*w = nw.WithDefaults()
		return nil
	})
	return err
}

// UnregisterRanks removes worker id of model from group, from every group of
// the model (group ""), or, with group and rank, only that rank (the last
// rank takes the record with it). Like RegisterRanks, it refuses records a
// sidecar keeps under a lease. Errors: *NotRegisteredError,
// *ConflictError, or the store's.
func UnregisterRanks(ctx context.Context, s Store, model, group string, id uint64, rank *uint32) error {
	remove := func(k Key) UpdateFunc {
		return func(_ *Worker, cur Current) error {
			if err := leased(k, cur); err != nil {
				return err
			}
			return RemoveRecord
		}
	}
	if group == "" {
		keys, err := s.Keys(ctx, model, id)
		if err != nil {
			return err
		}
		n := 0
		for _, k := range keys {
			_, err := s.Update(ctx, k, remove(k))
			switch {
			case errors.Is(err, ErrNotFound): // gone meanwhile
			case err != nil:
				return err
			default:
				n++
			}
		}
		if n == 0 {
			return &NotRegisteredError{fmt.Sprintf("instance_id: %d is not registered for model %s", id, clip.String(model))}
		}
		return nil
	}
	key := Key{Model: model, Group: group, WorkerID: id}
	notFound := &NotRegisteredError{fmt.Sprintf("instance_id: %d is not registered in %s/%s", id, clip.String(model), clip.String(group))}
	fn := remove(key)
	var noRank error
	if rank != nil {
		fn = func(w *Worker, cur Current) error {
			if !cur.Exists {
				return notFound
			}
			if err := leased(key, cur); err != nil {
				return err
			}
			evs, reps, err := rankEndpoints(*w)
			if err != nil {
				return fmt.Errorf("stored record %v: %w", key, err)
			}
			if _, ok := evs[*rank]; !ok {
				noRank = &NotRegisteredError{fmt.Sprintf("dp_rank: %d is not registered for instance %d", *rank, id)}
				return noRank
			}
			delete(evs, *rank)
			delete(reps, *rank)
			if len(evs) == 0 {
				return RemoveRecord
			}
			setRanks(w, evs, reps)
			return nil
		}
	}
	_, err := s.Update(ctx, key, fn)
	if errors.Is(err, ErrNotFound) && err != noRank { // the store's: no record
		return notFound
	}
	return err
}

// leased refuses a registrant's change to a record a sidecar keeps under
// a lease: writing it would detach the lease (the record would never
// expire), and deleting it would leave the sidecar renewing a lease that
// holds nothing, its engine invisible until the sidecar restarts.
func leased(k Key, cur Current) error {
	if cur.Lease == NoLease {
		return nil
	}
	return &ConflictError{"instance_id", fmt.Sprintf("%d in model=%s routing_group=%s is registered by a sidecar under lease %x; the record is the sidecar's (stop the sidecar to remove it)",
		k.WorkerID, clip.String(k.Model), clip.String(k.Group), cur.Lease)}
}

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Fields: []FieldError{{field, fmt.Sprintf(format, args...)}}}
}

// rankEndpoints expands a record's endpoints into one per rank.
func rankEndpoints(w Worker) (evs, reps map[uint32]string, err error) {
	evs, reps = map[uint32]string{}, map[uint32]string{}
	for _, r := range w.Ranks() {
		if evs[r], err = w.EventsEndpointFor(r); err != nil {
			return nil, nil, err
		}
		rp, err := w.ReplayEndpointFor(r)
		if err != nil {
			return nil, nil, err
		}
		if rp != "" {
			reps[r] = rp
		}
	}
	return evs, reps, nil
}

// setRanks stores per-rank endpoints (any set of ranks, which evs must
// not leave empty) in the record's per-rank form.
func setRanks(w *Worker, evs, reps map[uint32]string) {
	w.EventsEndpoint, w.ReplayEndpoint = "", ""
	w.EventsEndpoints, w.ReplayEndpoints = evs, nil
	w.DataParallelStartRank, w.DataParallelSize = slices.Min(slices.Collect(maps.Keys(evs))), uint32(len(evs))
	if len(reps) > 0 {
		w.ReplayEndpoints = reps
	}
}
