package apiserver

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// TestCoordinatorErrors: each of the coordinator's errors has its status,
// its text after the status's sentinel; typed errors are rendered with the
// names they echo clipped; the API's own sentinels pass as they are, and
// an error the coordinator does not name is a 500.
func TestCoordinatorErrors(t *testing.T) {
	pool := coordinator.PoolKey{Model: "m", Group: "g", Role: coordinator.RoleDecode}
	huge := strings.Repeat("x", 100)
	for _, c := range []struct {
		err    error
		status int
		msg    string
	}{
		{fmt.Errorf("pool p: %w", coordinator.ErrAllOverloaded), 429, "overloaded: pool p: all eligible workers overloaded"},
		{fmt.Errorf("pin: %w", coordinator.ErrPinnedOverloaded), 429, "overloaded: pin: pinned worker overloaded"},
		{coordinator.ErrPinnedNotAllowed, 400, "invalid request: pinned worker not allowed"},
		{coordinator.ErrInvalidPrompt, 400, "invalid request: invalid prompt"},
		{coordinator.ErrBadPinnedRank, 404, "not found: pinned worker or dp rank not in pool"},
		{coordinator.ErrPlanNotFound, 404, "not found: plan not found"},
		{coordinator.ErrReservationNotFound, 404, "not found: reservation not found"},
		{coordinator.ErrNoWorkers, 503, "temporarily unavailable: no workers"},
		{coordinator.ErrAllFiltered, 503, "temporarily unavailable: all eligible workers filtered"},
		{coordinator.ErrTooManyReservations, 503, "temporarily unavailable: too many live reservations"},
		{coordinator.ErrTooManyPlans, 503, "temporarily unavailable: too many live plans"},
		{coordinator.ErrDuplicateReservation, 409, "conflict: selection_id: duplicate reservation id"},
		{coordinator.ErrDuplicatePlan, 409, "conflict: duplicate plan id"},
		{coordinator.ErrInvalidState, 409, "conflict: invalid plan state"},
		{coordinator.ErrMissingTopologyDomain, 409, "conflict: kv-transfer domain has no topology value"},
		{coordinator.ErrMissingEnforcement, 409, "conflict: kv-transfer domain has no enforcement"},
		{coordinator.ErrMissingPreferredWeight, 409, "conflict: preferred kv-transfer enforcement has no weight"},
		{&coordinator.PartitionError{Model: huge, Group: "g"}, 404, "not found: model_name=" + clip.String(huge) + " routing_group=g: no such model (no model has workers)"},
		{&coordinator.PartitionError{Model: "n", Group: "g", Models: []string{"a", huge}}, 404, "not found: model_name=n routing_group=g: no such model (known models: a, " + clip.String(huge) + ")"},
		{&coordinator.PartitionError{Model: "m", Group: "h", Groups: []string{"g", "g2"}}, 404, "not found: model_name=m routing_group=h: no such routing group (routing groups of the model: g, g2)"},
		{&coordinator.NoEndpointError{Pool: pool, WorkerID: 3}, 404, "not found: worker 3 of pool m/g/decode is registered without an engine_endpoint: indexed, but not schedulable"},
		{&coordinator.EmptyPoolError{Pool: pool}, 503, "temporarily unavailable: pool m/g/decode has no workers"},
		{&coordinator.EmptyPoolError{Pool: pool, NoEndpoint: 2}, 503,
			"temporarily unavailable: pool m/g/decode has no schedulable workers: 2 workers registered without an engine_endpoint (indexed, but requests cannot be sent to them)"},
		{&coordinator.UnschedulableError{Err: fmt.Errorf("plan: %w", coordinator.ErrNoWorkers), Pools: []coordinator.EmptyPoolError{{Pool: pool, NoEndpoint: 1}}}, 503,
			"temporarily unavailable: plan: no workers (pool m/g/decode: 1 worker registered without an engine_endpoint, not schedulable)"},
		{fmt.Errorf("%w: as it is", ErrConflict), 409, "conflict: as it is"},
		{errors.New("index broken"), 500, ""},
	} {
		err := selectionError(c.err)
		var he *httpError
		switch {
		case c.status == http.StatusInternalServerError:
			if errors.As(err, &he) {
				t.Errorf("%v: %d %s, want a 500", c.err, he.status, he.msg)
			}
		case !errors.As(err, &he) || he.status != c.status || he.msg != c.msg:
			t.Errorf("%v: %v, want %d %s", c.err, err, c.status, c.msg)
		}
	}
	listedNames := make([]string, 10)
	for i := range listedNames {
		listedNames[i] = fmt.Sprint("m", i)
	}
	if got := listed(listedNames); got != "m0, m1, m2, m3, m4, m5, m6, m7, … 2 more" {
		t.Errorf("listed: %s", got)
	}
}
