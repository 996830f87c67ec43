// Package routing measures routing policies on a request trace: it
// replays the trace on a virtual clock against a simulated fleet of the
// mocker's engines (a vLLM-like prefix cache with LRU eviction and its
// continuous-batching scheduler with the H100 timing model), routing each
// request with one policy, and reports prefix-cache hit rate, TTFT,
// end-to-end latency, throughput and load imbalance.
//
// The KV-aware policies see what a daemon sees: every engine's KV events
// are encoded on the vLLM wire, delivered after a configurable delay,
// decoded, ordered by the stream cursor and applied to a real index; the
// oracle reads every engine's true cache at decision time instead.
//
// Config.Replicas spreads the requests over several routers that share
// nothing but the engines, as replicas of prefixd behind one gateway do:
// each has its own coordinator.Service (its own bookings) and its own
// index, fed by every engine's events after its own delay. Two ways for
// them to agree can be turned on: Config.ScrapeInterval gives each the
// engines' own load (as the daemon scrapes /metrics), Config.Sync each
// other's bookings (as the replica transport delivers them).
//
// A run is deterministic for a trace, configuration, policy and seed, and
// single-threaded; Sweep runs independent runs in parallel.
package routing

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/sim/quantile"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// Policy names a routing policy.
type Policy string

// The policies Run knows.
const (
	// Random picks an engine uniformly.
	Random Policy = "random"
	// RoundRobin cycles through the engines.
	RoundRobin Policy = "round-robin"
	// LeastLoaded picks the engine with the fewest requests in flight (as
	// the router counts them; ties at random).
	LeastLoaded Policy = "least-loaded"
	// ConsistentHash hashes the prompt's first block onto a ring of the
	// engines (64 points each).
	ConsistentHash Policy = "consistent-hash"
	// Approx is the approximate prefix-affinity routing of routers without
	// KV events: the router remembers the blocks of the prompts it routed
	// to each engine for ApproxTTL (Dynamo's --no-router-kv-events, 120 s;
	// the Gateway API Inference Extension's prefix-cache scorer and
	// SGLang's cache-aware router keep the same kind of router-side
	// guess), and scores it with prefixd's cost function.
	Approx Policy = "approx-prefix"
	// Prefixd is prefixd's selection as served: the cost function with its
	// defaults, over the index the engines' KV events build.
	Prefixd Policy = "prefixd"
	// PrefixdPredicted is Prefixd with booking predictions
	// (serve --predicted-ttl, Config.PredictedTTL): each booking's prompt
	// counts as cached on its worker until the TTL or its events.
	PrefixdPredicted Policy = "prefixd-predicted"
	// Oracle is Prefixd's cost function reading every engine's true cache
	// at decision time: no event lag, no approximation.
	Oracle Policy = "oracle"
	// Disagg is prefixd's decode-first plans on a prefill/decode split
	// of the fleet (PrefillEngines prefill, the rest decode): prefill runs
	// with one output token on the plan's prefill engine, its KV moves to
	// the plan's decode engine, which decodes.
	Disagg Policy = "prefixd-disagg"
	// PrefixdQueued is Prefixd with the router queue (serve
	// --queue-threshold): while every engine holds more prefill than
	// Config.QueueThreshold × its max_num_batched_tokens, a request waits
	// in the router, in the queue's order, and is placed when an engine
	// frees, on the caches of that moment.
	PrefixdQueued Policy = "prefixd-queued"
	// PrefixdSession is PrefixdQueued with session affinity (serve
	// --session-ttl, Config.SessionTTL): a request goes back to the
	// engine its session's last request was booked on while that engine
	// is under the busy thresholds. The trace names no sessions: a
	// request's session is its first hash id after the prefix every
	// request of the trace shares (Sessions), which a conversation's
	// turns share.
	PrefixdSession Policy = "prefixd-session"
)

// Policies lists every policy, in report order.
var Policies = []Policy{Random, RoundRobin, LeastLoaded, ConsistentHash, Approx, Prefixd, PrefixdPredicted, Oracle, Disagg, PrefixdQueued, PrefixdSession}

// ParsePolicy returns the policy named s.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q", s)
}

// Defaults of Config.
const (
	DefaultEngines     = 16
	DefaultTotalBlocks = 16384
	DefaultBlockSize   = 16
	DefaultEventDelay  = 10 * time.Millisecond
	// DefaultPredictedTTL is how long a booking's predicted blocks count
	// (events normally arrive within milliseconds of the prefill; the TTL
	// bounds a lost or slow stream's effect).
	DefaultPredictedTTL = 2 * time.Second
	DefaultApproxTTL    = 120 * time.Second
	// DefaultReplicaSpread is the most a replica's event delay exceeds
	// EventDelay: replicas subscribe over their own paths and apply on
	// their own cores, so their indexes lag by different amounts. A few
	// milliseconds, the order of EventDelay itself; the results hardly
	// depend on it (event lag of 1 s still makes the oracle's decisions on
	// this trace, docs/benchmarks.md).
	DefaultReplicaSpread = 10 * time.Millisecond
	// DefaultScrapeInterval is the daemon's engine scrape interval
	// (internal/engineload.DefaultInterval), the bench's when scraping
	// is turned on.
	DefaultScrapeInterval = 500 * time.Millisecond
	// DefaultSyncDelay is how long a booking takes to reach the other
	// replicas: the measured transport delivers a delta over loopback in
	// 14–31 µs at the median and 60–230 µs at p99
	// (internal/replica); 1 ms, several times that p99, leaves room for
	// a hop across the nodes of one cluster.
	DefaultSyncDelay = time.Millisecond
	// DefaultQueueThreshold is PrefixdQueued's busy threshold (serve
	// --queue-threshold's default).
	DefaultQueueThreshold = 0.5
	// DefaultSessionTTL is PrefixdSession's session TTL, on the replay's
	// clock: at ×1 it spans over 90 % of the shipped trace's gaps between
	// a conversation's turns (median 2 min, p90 8 min).
	DefaultSessionTTL = 10 * time.Minute
	// MaxReplicas bounds Config.Replicas.
	MaxReplicas = 64
	// DefaultVocab is Llama 3's vocabulary size: trace hash ids expand to
	// token ids below it.
	DefaultVocab = 128256
)

// Config is the fleet and the replay. Start from DefaultConfig.
type Config struct {
	// Engines is the fleet size; PrefillEngines of them prefill under
	// Disagg (0: half).
	Engines        int
	PrefillEngines int
	// TotalBlocks is each engine's KV pool, BlockSize tokens per block.
	TotalBlocks int
	BlockSize   int
	Timing      mocker.Timing
	// EventDelay is how long an engine's KV events take to reach the
	// index (publish → apply).
	EventDelay time.Duration
	// Speedup compresses the trace's arrival times (2: twice the load).
	Speedup float64
	// Options is the cost function of the KV-aware policies (prefixd's
	// serving defaults: coordinator.ServedOptions).
	Options coordinator.Options
	// PredictedTTL is PrefixdPredicted's prediction lifetime; ApproxTTL
	// the lifetime of Approx's router-side guess.
	PredictedTTL time.Duration
	ApproxTTL    time.Duration
	Seed         uint64

	// ArrivalJitter, if set, delays each request's arrival by a uniform
	// draw in [0, ArrivalJitter) from the seed, before Speedup. The
	// shipped trace's timestamps are 3 s buckets (about 10 requests at
	// the same instant); a jitter of 3s spreads each bucket over its
	// window, as its requests came.
	ArrivalJitter time.Duration

	// Replicas is how many routers share the traffic (0: one). Requests
	// go to them round-robin, in arrival order; each routes with its own
	// state (its own Service and bookings, its own index, predictions and
	// in-flight counts), as separate `prefixd serve` replicas behind one
	// gateway do today. One replica is the single router, result for
	// result.
	Replicas int
	// ReplicaSpread spreads the replicas' event delays: the first replica
	// receives events after EventDelay, each other one after EventDelay
	// plus a draw in [0, ReplicaSpread] from the seed.
	ReplicaSpread time.Duration
	// ScrapeInterval is how often each replica reads every engine's own
	// load (its /metrics: running and waiting requests, KV usage) and
	// hands it to its Service (SetEngineLoad): each replica at its own
	// phase in the interval, drawn from the seed, with the engine's state
	// at the end of that instant. 0: never (selection counts bookings
	// alone, as before engine load).
	ScrapeInterval time.Duration
	// Sync shares bookings between replicas: each replica's Service
	// reports its bookings' deltas (ServiceConfig.OnBooking) and every
	// other replica applies them (Service.ApplyPeer) SyncDelay later, in
	// order, on the virtual clock. Off: each replica counts only its own
	// bookings (as before booking sync). With one replica it changes
	// nothing.
	Sync      bool
	SyncDelay time.Duration
	// PeerSpread is every replica's coordinator.PoolConfig.PeerSpread: in
	// force once a replica has applied a peer's booking (Sync).
	PeerSpread float64
	// QueueThreshold is PrefixdQueued's busy threshold, a fraction of an
	// engine's max_num_batched_tokens of prefill booked
	// (coordinator.Thresholds.PrefillTokensFrac); Queue its queue. The
	// replay never sheds: Queue's MaxLen and MaxWait hold the whole trace.
	QueueThreshold float64
	Queue          coordinator.QueueConfig
	// SessionTTL is PrefixdSession's session affinity TTL
	// (coordinator.ServiceConfig.SessionTTL), on the replay's clock
	// (the trace's times divided by Speedup).
	SessionTTL time.Duration
}

// DefaultConfig returns the benchmark's fleet: 16 engines of 16,384
// blocks of 16 tokens (262,144 tokens, about 21 of the trace's average
// prompts each), on the H100 Llama-3.1-8B timing.
func DefaultConfig() Config {
	return Config{Engines: DefaultEngines, TotalBlocks: DefaultTotalBlocks, BlockSize: DefaultBlockSize,
		Timing: mocker.H100Llama8B, EventDelay: DefaultEventDelay, Speedup: 1, Options: coordinator.ServedOptions(),
		PredictedTTL: DefaultPredictedTTL, ApproxTTL: DefaultApproxTTL, Seed: 1, ReplicaSpread: DefaultReplicaSpread,
		SyncDelay: DefaultSyncDelay, PeerSpread: coordinator.DefaultPeerSpread, QueueThreshold: DefaultQueueThreshold, Queue: coordinator.DefaultQueueConfig(),
		SessionTTL: DefaultSessionTTL}
}

// replicas is how many routers the replay has.
func (c Config) replicas() int { return max(c.Replicas, 1) }

// replicaDelays returns each replica's event delay: EventDelay for the
// first, EventDelay plus a uniform draw in [0, ReplicaSpread] for each
// other, from the seed (its own stream: the replay's other draws do not
// move).
func (c Config) replicaDelays() []time.Duration {
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0xde1a7))
	out := make([]time.Duration, c.replicas())
	for i := range out {
		out[i] = c.EventDelay
		if i > 0 && c.ReplicaSpread > 0 {
			out[i] += time.Duration(rng.Int64N(int64(c.ReplicaSpread) + 1))
		}
	}
	return out
}

// scrapePhases returns when, in the first ScrapeInterval, each replica
// scrapes first: a uniform draw per replica from the seed (its own
// stream), as replicas started at different times do.
func (c Config) scrapePhases() []time.Duration {
	out := make([]time.Duration, c.replicas())
	if c.ScrapeInterval <= 0 {
		return out
	}
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x5c4a9e))
	for i := range out {
		out[i] = time.Duration(rng.Int64N(int64(c.ScrapeInterval)))
	}
	return out
}

// arrivals returns each request's arrival before Speedup: the trace's,
// plus a uniform draw in [0, ArrivalJitter) from the seed (its own
// stream) if set.
func (c Config) arrivals(reqs []trace.Request) []time.Duration {
	out := make([]time.Duration, len(reqs))
	var rng *rand.Rand
	if c.ArrivalJitter > 0 {
		rng = rand.New(rand.NewPCG(c.Seed, c.Seed^0xa441e))
	}
	for i, r := range reqs {
		out[i] = r.Arrival
		if rng != nil {
			out[i] += time.Duration(rng.Int64N(int64(c.ArrivalJitter)))
		}
	}
	return out
}

// prefillEngines is how many engines prefill under Disagg.
func (c Config) prefillEngines() int { return cmp.Or(c.PrefillEngines, c.Engines/2) }

// Validate names the first field out of range.
func (c Config) Validate() error {
	switch {
	case c.Engines < 2 || c.Engines > 4096:
		return fmt.Errorf("engines %d: want 2 to 4096", c.Engines)
	case c.PrefillEngines < 0 || c.PrefillEngines >= c.Engines:
		return fmt.Errorf("prefill engines %d: want 0 (half) to engines-1 (%d)", c.PrefillEngines, c.Engines-1)
	case c.TotalBlocks < 1 || c.TotalBlocks > 1<<24:
		return fmt.Errorf("total blocks %d: want 1 to %d", c.TotalBlocks, 1<<24)
	case c.BlockSize < 1 || c.BlockSize > 1024:
		return fmt.Errorf("block size %d: want 1 to 1024", c.BlockSize)
	case c.EventDelay < 0:
		return fmt.Errorf("event delay %v: must not be negative", c.EventDelay)
	case !(c.Speedup > 0) || math.IsInf(c.Speedup, 0):
		return fmt.Errorf("speedup %v: want a positive factor", c.Speedup)
	case c.PredictedTTL <= 0 || c.ApproxTTL <= 0:
		return fmt.Errorf("predicted TTL %v and approx TTL %v must be positive", c.PredictedTTL, c.ApproxTTL)
	case c.Replicas < 0 || c.Replicas > MaxReplicas:
		return fmt.Errorf("replicas %d: want 0 (one) to %d", c.Replicas, MaxReplicas)
	case c.ReplicaSpread < 0 || c.ReplicaSpread > time.Minute:
		return fmt.Errorf("replica spread %v: want 0 to 1m", c.ReplicaSpread)
	case c.ScrapeInterval < 0 || (c.ScrapeInterval > 0 && c.ScrapeInterval < time.Millisecond) || c.ScrapeInterval > time.Hour:
		return fmt.Errorf("scrape interval %v: want 0 (never) or 1ms to 1h", c.ScrapeInterval)
	case c.ArrivalJitter < 0 || c.ArrivalJitter > time.Hour:
		return fmt.Errorf("arrival jitter %v: want 0 to 1h", c.ArrivalJitter)
	case c.SyncDelay < 0 || c.SyncDelay > time.Minute:
		return fmt.Errorf("sync delay %v: want 0 to 1m", c.SyncDelay)
	case !(c.PeerSpread >= 0) || c.PeerSpread > 100:
		return fmt.Errorf("peer spread %v: want 0 to 100", c.PeerSpread)
	case !(c.QueueThreshold > 0) || c.QueueThreshold > 1000:
		return fmt.Errorf("queue threshold %v: want more than 0, at most 1000", c.QueueThreshold)
	case c.SessionTTL <= 0 || c.SessionTTL > 24*time.Hour:
		return fmt.Errorf("session TTL %v: want more than 0, at most 24h", c.SessionTTL)
	}
	return c.Timing.WithDefaults().Validate()
}

// Latency is a distribution's summary, in milliseconds.
type Latency struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
}

// IndexWork is what the index did in a KV-aware run.
type IndexWork struct {
	Batches uint64 `json:"batches"`
	Events  uint64 `json:"events"`
	// Blocks stored and removed by the events applied; Removed of them.
	Blocks  uint64 `json:"blocks"`
	Removed uint64 `json:"removed_blocks"`
	// Entries is the index's (block, rank) entries at the end, and
	// MaxEntries its peak (sampled at each delivery).
	Entries    int `json:"entries"`
	MaxEntries int `json:"max_entries"`
	// ApplyErrors counts batches the index refused (0 on a healthy run).
	ApplyErrors int `json:"apply_errors"`
	// Predicted is the predictions' (block, rank) entries at the end.
	Predicted int `json:"predicted_entries"`
}

// Result is one run's measurements.
type Result struct {
	Policy Policy `json:"policy"`
	// Replicas is how many routers shared the traffic (Config.Replicas;
	// 1: one router).
	Replicas int     `json:"replicas"`
	Speedup  float64 `json:"speedup"`
	// Weight is the cost function's overlap weight of the run.
	Weight float64 `json:"overlap_weight"`
	// Requests were offered; Completed finished, Failed did not (refused
	// by an engine or the router).
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// OfferedRPS is the trace's request rate after Speedup (requests over
	// the arrival window, first to last arrival); ThroughputRPS the
	// requests completed within that window, per second of it; OutputTPS
	// all completed requests' output tokens per second, from the first
	// arrival to the last completion.
	OfferedRPS    float64 `json:"offered_rps"`
	ThroughputRPS float64 `json:"throughput_rps"`
	OutputTPS     float64 `json:"output_tokens_per_s"`
	// HitRate is the prompt tokens the engines' prefix caches served, over
	// all prompt tokens of completed requests (the prefill engine's, under
	// Disagg).
	HitRate float64 `json:"hit_rate"`
	TTFT    Latency `json:"ttft"`
	E2E     Latency `json:"e2e"`
	// Imbalance is the busiest engine's busy time over the mean (1:
	// perfectly even); under Disagg, over the prefill engines.
	Imbalance float64 `json:"imbalance"`
	// Bookings is the reservations and plans prefixd still held at the end,
	// over every replica (0: none leaked).
	Bookings int `json:"bookings"`
	// PeerDropped counts booking deltas a replica refused (Config.Sync: a
	// free for a peer booking its own expiry already took);
	// ScrapeErrors engine loads a replica refused (0 on a healthy run).
	PeerDropped int `json:"peer_dropped,omitempty"`
	// Queued counts requests that waited in a router queue
	// (PrefixdQueued).
	Queued int `json:"queued,omitempty"`
	// SessionHits counts requests booked back on their session's engine,
	// SessionMoves those whose session's engine was busy, booked
	// elsewhere (PrefixdSession), over every replica.
	SessionHits  int `json:"session_hits,omitempty"`
	SessionMoves int `json:"session_moves,omitempty"`
	ScrapeErrors int `json:"scrape_errors,omitempty"`
	// Fallbacks counts Disagg plans that ran in bypass (prefill on the
	// decode engine).
	Bypass int `json:"bypass,omitempty"`
	// Index is what the replicas' indexes did: counters summed over them,
	// entries the largest replica's.
	Index   *IndexWork `json:"index,omitempty"`
	Virtual float64    `json:"virtual_seconds"`
	Wall    float64    `json:"wall_seconds"`
	// TTFTs are the completed requests' TTFTs in ms, sorted (for CDFs).
	TTFTs []float64 `json:"-"`
}

// Run replays reqs (prompts holds each one's tokens, Prompts) on a fresh
// fleet configured by cfg, routing with policy.
func Run(cfg Config, reqs []trace.Request, prompts [][]uint32, policy Policy) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if len(prompts) != len(reqs) {
		return Result{}, fmt.Errorf("%d prompts for %d requests", len(prompts), len(reqs))
	}
	if len(reqs) == 0 {
		return Result{}, errors.New("no requests")
	}
	start := time.Now()
	s, err := newSim(cfg, reqs, prompts, policy)
	if err != nil {
		return Result{}, err
	}
	if err := s.run(); err != nil {
		return Result{}, fmt.Errorf("%s: %w", policy, err)
	}
	res := s.result()
	res.Wall = time.Since(start).Seconds()
	return res, nil
}

// Prompts expands every request's hash ids into token ids below vocab.
func Prompts(reqs []trace.Request, vocab uint32) [][]uint32 {
	out := make([][]uint32, len(reqs))
	for i, r := range reqs {
		out[i] = r.Tokens(make([]uint32, 0, r.InputLength), vocab)
	}
	return out
}

// summarize returns the latency summary of ms (quantiles by nearest rank).
func summarize(ms []float64) Latency {
	if len(ms) == 0 {
		return Latency{}
	}
	var sum float64
	for _, v := range ms {
		sum += v
	}
	q := quantile.Of(ms)
	return Latency{Mean: sum / float64(len(ms)), P50: q.At(0.50), P90: q.At(0.90), P99: q.At(0.99)}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// byPolicyOrder sorts results by policy (report order), weight, replicas,
// speedup.
func byPolicyOrder(a, b Result) int {
	ia, ib := slices.Index(Policies, a.Policy), slices.Index(Policies, b.Policy)
	return cmp.Or(cmp.Compare(ia, ib), cmp.Compare(a.Weight, b.Weight), cmp.Compare(a.Replicas, b.Replicas),
		cmp.Compare(a.Speedup, b.Speedup))
}

// Name is the result's row name: its policy, and with withReplicas its
// replica count too ("prefixd/r8").
func (r Result) Name(withReplicas bool) string {
	if !withReplicas {
		return string(r.Policy)
	}
	return fmt.Sprintf("%s/r%d", r.Policy, max(r.Replicas, 1))
}
