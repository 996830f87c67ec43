package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// clock is a Service's clock that tests move by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newService(t *testing.T, cfg ServiceConfig, engines ...Engine) (*Service, *clock) {
	t.Helper()
	clk := &clock{t0}
	cfg.Now, cfg.Rand = clk.now, seeded(1)
	if cfg.Pool == (PoolConfig{}) {
		cfg.Pool = DefaultPoolConfig()
	}
	s := NewService(cfg)
	for _, e := range engines {
		if err := s.SetEngine(e); err != nil {
			t.Fatal(err)
		}
	}
	return s, clk
}

// engine is a one-rank engine of model m in group "default".
func engine(id uint64, role Role, endpoint string) Engine {
	return Engine{Worker: Worker{Rank: rk(id), Model: "m", Group: "default", Role: role, Endpoint: endpoint}, DPRanks: []uint32{0}, BlockSize: bs}
}

func endpoint(id uint64) string { return fmt.Sprintf("http://w%d:8000", id) }

func planReq(id string) Request {
	return Request{ID: id, Model: "m", DecodeGroup: "default", PrefillGroup: "default", Tokens: []uint32{1, 2, 3}}
}

// TestServiceFinishedPlansReusedID: a plan id that finishes, is reused and
// finishes again is remembered once, as the newest: the history evicts its
// oldest entry, never the reused id's new one (the old FIFO kept the stale
// position and dropped the new entry 4,095 plans later).
func TestServiceFinishedPlansReusedID(t *testing.T) {
	s, clk := newService(t, ServiceConfig{}, engine(1, RoleDecode, endpoint(1)), engine(2, RolePrefill, endpoint(2)))
	plan := func(id string) {
		t.Helper()
		if p, err := s.Plan(planReq(id)); err != nil {
			t.Fatalf("plan %s: %+v %v", id, p, err)
		}
	}
	// Past every plan's TTL.
	expire := func() {
		clk.t = clk.t.Add(DefaultPlanTTL + time.Second)
		s.Expire(clk.t)
	}
	get := func(id string) bool {
		_, ok := s.Get(id)
		return ok
	}
	plan("x")
	expire()
	plan("x") // reused
	expire()
	if !get("x") {
		t.Fatal("the reused plan is not remembered")
	}
	for i := range maxFinished - 1 {
		plan(fmt.Sprint("p", i))
	}
	expire()
	if n := s.finished.Len(); n != maxFinished {
		t.Fatalf("%d finished plans remembered, want %d", n, maxFinished)
	}
	if !get("x") || !get("p0") || !get(fmt.Sprint("p", maxFinished-2)) {
		t.Fatalf("with exactly %d finished plans, one was dropped: x %v, p0 %v", maxFinished, get("x"), get("p0"))
	}
	// One more: x, now the oldest, goes, and only x.
	plan("last")
	expire()
	if get("x") || !get("p0") || !get("last") || s.finished.Len() != maxFinished {
		t.Fatalf("after one more: x %v (want false), p0 %v, last %v, %d remembered", get("x"), get("p0"), get("last"), s.finished.Len())
	}
}

// TestServiceExpiry: Expire expires stale plans, which Get still returns
// (as Expired) and Release no longer finds, and stale reservations, whose
// ids are free again; a plan released by its client is not remembered.
func TestServiceExpiry(t *testing.T) {
	s, clk := newService(t, ServiceConfig{}, engine(1, RoleDecode, endpoint(1)), engine(2, RolePrefill, endpoint(2)))
	if p, err := s.Plan(planReq("p")); err != nil || p.State != Linked || p.Decode.Endpoint != endpoint(1) || p.Prefill.Endpoint != endpoint(2) {
		t.Fatalf("plan %+v %v", p, err)
	}
	r := SelectRequest{ID: "r", Pool: PoolKey{Model: "m", Group: "default", Role: RolePrefill}, Tokens: []uint32{1}}
	if _, err := s.SelectAndReserve(r); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(DefaultPlanTTL)
	s.Expire(clk.t)
	if len(s.byID) != 0 {
		t.Errorf("expired reservation ids kept: %v", s.byID)
	}
	if got, ok := s.Get("p"); !ok || got.State != Expired || got.Decode != nil {
		t.Fatalf("after expiry: %+v %v", got, ok)
	}
	if _, err := s.Release("p"); !errors.Is(err, ErrPlanNotFound) || err.Error() != "plan p not found" {
		t.Fatalf("release expired: %v", err)
	}
	if err := s.Free("r"); !errors.Is(err, ErrReservationNotFound) || err.Error() != "reservation r not found" {
		t.Fatalf("free expired: %v", err)
	}
	if _, err := s.SelectAndReserve(r); err != nil {
		t.Fatalf("reuse of an expired id: %v", err)
	}
	if _, err := s.Plan(planReq("q")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release("q"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("q"); ok {
		t.Error("a plan released by its client is remembered")
	}
}

// TestServiceReservationIDsAreGlobal: a reservation id live in one pool is
// a conflict in every pool; Free and ReservePrefillComplete find the pool
// of the id; an id whose worker left is free again.
func TestServiceReservationIDsAreGlobal(t *testing.T) {
	s, _ := newService(t, ServiceConfig{}, engine(1, RoleAggregated, endpoint(1)), engine(2, RolePrefill, endpoint(2)))
	agg := SelectRequest{ID: "r", Pool: PoolKey{Model: "m", Group: "default", Role: RoleAggregated}, Tokens: []uint32{1}}
	pre := agg
	pre.Pool.Role = RolePrefill
	c, err := s.SelectAndReserve(agg)
	if err != nil || c.Rank != rk(1) || c.Endpoint != endpoint(1) || c.BlockSize != bs || c.PromptTokens != 1 || !c.TrackPrefillTokens {
		t.Fatalf("select_and_reserve: %+v %v", c, err)
	}
	for _, r := range []SelectRequest{agg, pre} {
		if _, err := s.SelectAndReserve(r); !errors.Is(err, ErrDuplicateReservation) || err.Error() != "reservation r already exists" {
			t.Errorf("%v: %v", r.Pool, err)
		}
		r.Pin = &indexer.Rank{WorkerID: 2}
		if _, err := s.Reserve(r); !errors.Is(err, ErrDuplicateReservation) {
			t.Errorf("reserve in %v: %v", r.Pool, err)
		}
	}
	if err := s.ReservePrefillComplete("r"); err != nil {
		t.Fatal(err)
	}
	if err := s.Free("r"); err != nil {
		t.Fatal(err)
	}
	if err := s.Free("r"); !errors.Is(err, ErrReservationNotFound) {
		t.Fatalf("second free: %v", err)
	}
	pre.Pin = &indexer.Rank{WorkerID: 2}
	if _, err := s.Reserve(pre); err != nil {
		t.Fatal(err)
	}
	s.RemoveEngine(EngineKey{Model: "m", Group: "default", WorkerID: 2})
	if err := s.ReservePrefillComplete("r"); !errors.Is(err, ErrReservationNotFound) {
		t.Fatalf("prefill_complete after the worker left: %v", err)
	}
	if _, err := s.SelectAndReserve(agg); err != nil {
		t.Fatalf("the id of a departed worker's reservation: %v", err)
	}
	if _, err := s.Reserve(SelectRequest{ID: "x", Pool: agg.Pool, Tokens: []uint32{1}}); !errors.Is(err, ErrBadPinnedRank) {
		t.Errorf("reserve without a worker: %v", err)
	}
}

// TestServiceEngines: an engine's dp ranks join its pool and leave it when
// the engine drops them; an engine without an endpoint joins no pool, and
// the errors say so; unknown partitions say what is known.
func TestServiceEngines(t *testing.T) {
	obs := &recorder{}
	two := engine(1, RoleAggregated, endpoint(1))
	two.DPRanks = []uint32{0, 1}
	s, _ := newService(t, ServiceConfig{Observer: obs}, two, engine(2, RoleAggregated, ""))
	k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
	if got := s.pools.Pool(k).Ranks(); !slices.Equal(got, []indexer.Rank{{WorkerID: 1}, {WorkerID: 1, DPRank: 1}}) {
		t.Fatalf("ranks %v", got)
	}
	two.DPRanks = []uint32{1}
	if err := s.SetEngine(two); err != nil {
		t.Fatal(err)
	}
	if got := s.pools.Pool(k).Ranks(); !slices.Equal(got, []indexer.Rank{{WorkerID: 1, DPRank: 1}}) || !slices.Equal(obs.removed, []indexer.Rank{rk(1)}) {
		t.Fatalf("ranks %v, removed %v", got, obs.removed)
	}
	bad := engine(3, RoleAggregated, endpoint(3))
	bad.TotalKVBlocks = -1
	if err := s.SetEngine(bad); !errors.Is(err, ErrInvalidWorker) {
		t.Errorf("an invalid worker: %v", err)
	}

	r := SelectRequest{Pool: k, Tokens: []uint32{1}, Pin: &indexer.Rank{WorkerID: 2}}
	var ne *NoEndpointError
	if _, err := s.Select(r); !errors.As(err, &ne) || *ne != (NoEndpointError{Pool: k, WorkerID: 2}) || !errors.Is(err, ErrBadPinnedRank) {
		t.Errorf("pinned to the engine without an endpoint: %v", err)
	}
	s.RemoveEngine(two.Key())
	r.Pin = nil
	var ee *EmptyPoolError
	if _, err := s.Select(r); !errors.As(err, &ee) || *ee != (EmptyPoolError{Pool: k, NoEndpoint: 1}) || !errors.Is(err, ErrNoWorkers) {
		t.Errorf("only an engine without an endpoint: %v", err)
	}
	if _, err := s.Select(SelectRequest{Pool: PoolKey{Model: "m", Group: "default", Role: RoleDecode}, Tokens: []uint32{1}}); !errors.As(err, &ee) || ee.NoEndpoint != 0 {
		t.Errorf("a pool no engine joined: %v", err)
	}
	dec := engine(4, RoleDecode, "")
	if err := s.SetEngine(dec); err != nil {
		t.Fatal(err)
	}
	var ue *UnschedulableError
	_, err := s.Plan(planReq("p"))
	if !errors.As(err, &ue) || !errors.Is(err, ErrNoWorkers) || !slices.Equal(ue.Pools, []EmptyPoolError{{Pool: PoolKey{Model: "m", Group: "default", Role: RoleDecode}, NoEndpoint: 1}}) {
		t.Errorf("plan without schedulable decode engines: %v", err)
	}

	other := engine(5, RoleAggregated, endpoint(5))
	other.Group = "g2"
	if err := s.SetEngine(other); err != nil {
		t.Fatal(err)
	}
	var pe *PartitionError
	for _, c := range []struct {
		model, group string
		groups       []string
		models       []string
	}{
		{"m", "g3", []string{"default", "g2"}, nil},
		{"n", "default", nil, []string{"m"}},
	} {
		r := SelectRequest{Pool: PoolKey{Model: c.model, Group: c.group}, Tokens: []uint32{1}}
		if _, err := s.Select(r); !errors.As(err, &pe) || !errors.Is(err, ErrUnknownPartition) || !slices.Equal(pe.Groups, c.groups) || !slices.Equal(pe.Models, c.models) {
			t.Errorf("%s/%s: %v %+v", c.model, c.group, err, pe)
		}
		if _, err := s.Plan(Request{ID: "q", Model: c.model, DecodeGroup: "default", PrefillGroup: c.group, Tokens: []uint32{1}}); !errors.Is(err, ErrUnknownPartition) {
			t.Errorf("plan in %s/%s: %v", c.model, c.group, err)
		}
	}
	empty, _ := newService(t, ServiceConfig{})
	if _, err := empty.Select(r); !errors.As(err, &pe) || pe.Models != nil || pe.Groups != nil {
		t.Errorf("no engines at all: %v", err)
	}
}

// TestServiceBlockSize: while the source knows no block size for a
// partition, prompts are hashed with the one its engines registered.
func TestServiceBlockSize(t *testing.T) {
	e := engine(1, RoleAggregated, endpoint(1))
	e.BlockSize = 4
	s, _ := newService(t, ServiceConfig{Source: overlapFunc(func(string, string) []indexer.Overlap { return nil })}, e)
	r := SelectRequest{Pool: e.Worker.Key(), Tokens: make([]uint32, 8)}
	if c, err := s.Select(r); err != nil || c.BlockSize != bs {
		t.Fatalf("with the source's block size: %+v %v", c, err)
	}
	s.src = noBlockSize{}
	if c, err := s.Select(r); err != nil || c.BlockSize != 4 {
		t.Fatalf("with the registered block size: %+v %v", c, err)
	}
	r.Tokens, r.Hashes = nil, []uint64{1, 2, 3}
	if c, err := s.Select(r); err != nil || c.BlockSize != 4 || c.PromptTokens != 12 {
		t.Fatalf("block hashes with the registered block size: %+v %v", c, err)
	}
}

type noBlockSize struct{}

func (noBlockSize) Overlaps(string, string, []uint32, string, string) ([]indexer.Overlap, int, error) {
	return nil, 0, nil
}

func (noBlockSize) OverlapsByHash(string, string, []uint64) ([]indexer.Overlap, int, error) {
	return nil, 0, nil
}

// TestServiceObserver: the observer sees every selection, every plan
// change with its liveness, and plans booked.
func TestServiceObserver(t *testing.T) {
	obs := &recorder{}
	s, _ := newService(t, ServiceConfig{Observer: obs}, engine(1, RoleDecode, endpoint(1)), engine(2, RolePrefill, endpoint(2)))
	pre := SelectRequest{ID: "r", Pool: PoolKey{Model: "m", Group: "default", Role: RolePrefill}, Tokens: []uint32{1}}
	for _, op := range []func(SelectRequest) (Choice, error){s.Select, s.SelectAndReserve} {
		if _, err := op(pre); err != nil {
			t.Fatal(err)
		}
	}
	pre.ID, pre.Pin = "r2", &indexer.Rank{WorkerID: 2}
	if _, err := s.Reserve(pre); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Plan(planReq("p")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release("p"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(obs.ops, []SelectOp{OpSelect, OpSelectAndReserve, OpReserve}) || len(obs.planned) != 1 || obs.planned[0].State != Linked ||
		fmt.Sprint(obs.changes) != "[p Linked live 1 p Released gone 0]" {
		t.Errorf("observed %v, planned %v, changes %v", obs.ops, obs.planned, obs.changes)
	}
}

type recorder struct {
	ops     []SelectOp
	planned []Plan
	changes []string
	removed []indexer.Rank
}

func (r *recorder) PlanChanged(p Plan, live bool, plans int) {
	state := "gone"
	if live {
		state = "live"
	}
	r.changes = append(r.changes, fmt.Sprintf("%s %v %s %d", p.ID, p.State, state, plans))
}
func (r *recorder) Planned(p Plan)                 { r.planned = append(r.planned, p) }
func (r *recorder) Selected(op SelectOp, _ Choice) { r.ops = append(r.ops, op) }
func (r *recorder) RankRemoved(rank indexer.Rank)  { r.removed = append(r.removed, rank) }

// TestServicePredictions: with predictions, a booking's prompt counts as
// cached on its rank until the TTL, so a second request with the same new
// prefix, arriving after the first's prefill but before its events,
// follows it; without them it
// goes to the idle worker; a departed rank's predictions go with it.
func TestServicePredictions(t *testing.T) {
	agg := func(id uint64) Engine { return engine(id, RoleAggregated, endpoint(id)) }
	tokens := make([]uint32, 64*bs)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	pool := PoolKey{Model: "m", Group: "default"}
	for _, tc := range []struct {
		name   string
		pred   *indexer.Predictions
		follow bool
	}{
		{"without", nil, false},
		{"with", indexer.NewPredictions(time.Second, 0, 0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, clk := newService(t, ServiceConfig{Predicted: tc.pred}, agg(1), agg(2))
			first, err := s.SelectAndReserve(SelectRequest{ID: "a", Pool: pool, Tokens: tokens})
			if err != nil {
				t.Fatal(err)
			}
			// The first prefill is done; its events have not arrived.
			if err := s.ReservePrefillComplete("a"); err != nil {
				t.Fatal(err)
			}
			second, err := s.SelectAndReserve(SelectRequest{ID: "b", Pool: pool, Tokens: tokens})
			if err != nil {
				t.Fatal(err)
			}
			if got := second.Rank == first.Rank; got != tc.follow {
				t.Fatalf("first on %v, second on %v: followed %v, want %v", first.Rank, second.Rank, got, tc.follow)
			}
			if tc.pred == nil {
				return
			}
			if second.Overlap.Device != 64 || second.CachedTokens != float64(len(tokens)) {
				t.Fatalf("second's overlap %+v, cached %v: want the predicted 64 blocks", second.Overlap, second.CachedTokens)
			}
			// b is pending: its prediction outlives the TTL until its
			// prefill completes; then it lives one TTL more.
			clk.t = clk.t.Add(time.Second)
			if n := tc.pred.Pending(); n != 1 {
				t.Fatalf("%d pending bookings, want b", n)
			}
			if err := s.ReservePrefillComplete("b"); err != nil {
				t.Fatal(err)
			}
			if err := s.Free("a"); err != nil {
				t.Fatal(err)
			}
			if n := tc.pred.Pending(); n != 0 || tc.pred.Len() != 64 {
				t.Fatalf("%d pending, %d entries: want b's 64 settled", n, tc.pred.Len())
			}
			clk.t = clk.t.Add(time.Second)
			tc.pred.Expire(clk.t)
			if n := tc.pred.Len(); n != 0 {
				t.Fatalf("%d predictions past b's TTL", n)
			}
			tc.pred.Book("c", indexer.PartitionKey{Model: "m", Group: "default"}, first.Rank, []uint64{1, 2}, clk.t)
			s.RemoveEngine(EngineKey{Model: "m", Group: "default", WorkerID: first.Rank.WorkerID})
			if n := tc.pred.Len(); n != 0 {
				t.Fatalf("%d predictions left after the rank left", n)
			}
		})
	}
}
