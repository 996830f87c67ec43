package coordinator

import (
	"errors"
	"fmt"
	"strings"
)

// Selection errors. Callers branch on them (the HTTP layer maps them to
// status codes), so they are sentinels; returned errors wrap them with the
// operation and identifiers.
var (
	// ErrNoWorkers: the pool has no workers (or does not exist).
	ErrNoWorkers = errors.New("no workers")
	// ErrAllFiltered: every worker was removed by the allow-set or the required taints.
	ErrAllFiltered = errors.New("all eligible workers filtered")
	// ErrAllOverloaded: every eligible worker is over a busy threshold.
	ErrAllOverloaded = errors.New("all eligible workers overloaded")
	// ErrPinnedOverloaded: the pinned worker is over a busy threshold. A
	// pinned request is never rerouted.
	ErrPinnedOverloaded = errors.New("pinned worker overloaded")
	// ErrPinnedNotAllowed: the pinned worker is excluded by the allow-set or the required taints.
	ErrPinnedNotAllowed = errors.New("pinned worker not allowed")
	// ErrBadPinnedRank: the pinned (worker id, dp rank) is not in the pool.
	ErrBadPinnedRank = errors.New("pinned worker or dp rank not in pool")
	// ErrWrongPool: a worker was given to a pool of another (model, group, role).
	ErrWrongPool = errors.New("worker belongs to another pool")
	// ErrInvalidWorker: a worker's metadata is unusable (negative capacity).
	ErrInvalidWorker = errors.New("invalid worker")
)

// Reservation errors.
var (
	// ErrDuplicateReservation: a live reservation already has this selection id.
	ErrDuplicateReservation = errors.New("duplicate reservation id")
	// ErrTooManyReservations: the pool holds its maximum of live reservations.
	ErrTooManyReservations = errors.New("too many live reservations")
)

// KV-transfer metadata errors (incomplete metadata is never ignored).
var (
	ErrMissingTopologyDomain  = errors.New("kv-transfer domain has no topology value")
	ErrMissingEnforcement     = errors.New("kv-transfer domain has no enforcement")
	ErrMissingPreferredWeight = errors.New("preferred kv-transfer enforcement has no weight")
)

// Plan errors.
var (
	// ErrDecodePreview wraps the failure of the advisory decode selection.
	ErrDecodePreview = errors.New("decode preview")
	// ErrDecodeCommit wraps the failure of the decode booking.
	ErrDecodeCommit = errors.New("decode commit")
	// ErrPrefillCommit wraps the failure of the prefill booking.
	ErrPrefillCommit = errors.New("prefill commit")
	// ErrInvalidState: the operation is not valid in the plan's state.
	ErrInvalidState = errors.New("invalid plan state")
	// ErrPlanNotFound: no live plan has this id (never created, or already
	// released, compensated or expired).
	ErrPlanNotFound = errors.New("plan not found")
	// ErrDuplicatePlan: a live plan already has this id.
	ErrDuplicatePlan = errors.New("duplicate plan id")
	// ErrTooManyPlans: the coordinator holds its maximum of live plans.
	ErrTooManyPlans = errors.New("too many live plans")
)

// ErrInvalidPrompt: a prompt without a positive block size.
var ErrInvalidPrompt = errors.New("invalid prompt")

// Service errors.
var (
	// ErrReservationNotFound: no live reservation has this id (never
	// booked, freed, or dropped with its worker or by expiry).
	ErrReservationNotFound = errors.New("reservation not found")
	// ErrUnknownPartition: no engine of a pool role ever registered in
	// the (model, routing group); the error is a *PartitionError.
	ErrUnknownPartition = errors.New("unknown partition")
)

// A PartitionError is ErrUnknownPartition with what the Service knows:
// the model's routing groups, or, for an unknown model, the models.
type PartitionError struct {
	Model, Group string
	// Groups are the model's routing groups, sorted; empty if the model
	// is unknown.
	Groups []string
	// Models are the known models, sorted (set only when Groups is
	// empty; empty if no engine ever registered).
	Models []string
}

func (e *PartitionError) Error() string {
	return fmt.Sprintf("model %q routing group %q: %v", e.Model, e.Group, ErrUnknownPartition)
}

// Unwrap returns ErrUnknownPartition.
func (e *PartitionError) Unwrap() error { return ErrUnknownPartition }

// A NoEndpointError is a request pinned to an engine that registered
// without an endpoint: it is known, but joined no pool (a selection could
// not say where to send the request). It wraps ErrBadPinnedRank.
type NoEndpointError struct {
	Pool     PoolKey
	WorkerID uint64
}

func (e *NoEndpointError) Error() string {
	return fmt.Sprintf("pool %v pin worker %d: registered without an endpoint: %v", e.Pool, e.WorkerID, ErrBadPinnedRank)
}

// Unwrap returns ErrBadPinnedRank.
func (e *NoEndpointError) Unwrap() error { return ErrBadPinnedRank }

// An EmptyPoolError is a selection in a pool without workers: NoEndpoint
// engines registered for it without an endpoint. It wraps ErrNoWorkers.
type EmptyPoolError struct {
	Pool       PoolKey
	NoEndpoint int
}

func (e *EmptyPoolError) Error() string {
	if e.NoEndpoint > 0 {
		return fmt.Sprintf("pool %v: %v: %d engines registered without an endpoint", e.Pool, ErrNoWorkers, e.NoEndpoint)
	}
	return fmt.Sprintf("pool %v: %v", e.Pool, ErrNoWorkers)
}

// Unwrap returns ErrNoWorkers.
func (e *EmptyPoolError) Unwrap() error { return ErrNoWorkers }

// An UnschedulableError is a plan's ErrNoWorkers (Err) annotated with the
// plan's pools that have no workers although engines registered for
// them without an endpoint.
type UnschedulableError struct {
	Err   error
	Pools []EmptyPoolError
}

func (e *UnschedulableError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	for _, p := range e.Pools {
		fmt.Fprintf(&b, " (pool %v: %d engines registered without an endpoint)", p.Pool, p.NoEndpoint)
	}
	return b.String()
}

// Unwrap returns Err.
func (e *UnschedulableError) Unwrap() error { return e.Err }

// textError is an error with its own text that wraps a sentinel.
type textError struct {
	msg string
	err error
}

func (e *textError) Error() string { return e.msg }
func (e *textError) Unwrap() error { return e.err }
