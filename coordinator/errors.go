package coordinator

import "errors"

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
