package routing

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/prefixd/prefixd/coordinator"
)

// Report is a sweep's results with what produced them (the JSON output).
type Report struct {
	Trace    string    `json:"trace"`
	Requests int       `json:"requests"`
	Fleet    FleetInfo `json:"fleet"`
	Results  []Result  `json:"results"`
	// Knees is each policy's saturation: the highest speedup at which it
	// still completed at least 90 % of the offered request rate within the
	// arrival window, and its peak throughput over the sweep.
	Knees []Knee `json:"knees"`
	// Weights are prefixd's and the oracle's runs over overlap weights
	// (BenchOptions.Weights), if any.
	Weights []Result `json:"weights,omitempty"`
	// Replicas is the replica counts swept (BenchOptions.Replicas), if
	// any: rows are then named with their count ("prefixd/r8").
	Replicas []int `json:"replicas,omitempty"`
}

// FleetInfo is the configuration a report was made with.
type FleetInfo struct {
	Engines        int     `json:"engines"`
	PrefillEngines int     `json:"prefill_engines"`
	TotalBlocks    int     `json:"kv_blocks_per_engine"`
	BlockSize      int     `json:"block_size"`
	EventDelayMS   float64 `json:"event_delay_ms"`
	PredictedTTLS  float64 `json:"predicted_ttl_s"`
	ApproxTTLS     float64 `json:"approx_ttl_s"`
	// ReplicaSpreadMS spreads the replicas' event delays (Config.ReplicaSpread).
	ReplicaSpreadMS float64 `json:"replica_spread_ms,omitempty"`
	OverlapWeight   float64 `json:"overlap_weight"`
	Seed            uint64  `json:"seed"`
	// ScrapeIntervalMS is how often replicas read the engines' load
	// (Config.ScrapeInterval; 0: never); SyncDelayMS, if set, how long
	// a booking took to reach the other replicas (Config.Sync).
	ScrapeIntervalMS float64 `json:"scrape_interval_ms,omitempty"`
	// ArrivalJitterMS delays arrivals (Config.ArrivalJitter).
	ArrivalJitterMS float64  `json:"arrival_jitter_ms,omitempty"`
	SyncDelayMS     *float64 `json:"sync_delay_ms,omitempty"`
	// PeerSpread is the replicas' spread while they share bookings
	// (Config.PeerSpread; with Sync only).
	PeerSpread float64 `json:"peer_spread,omitempty"`
	// Queue is PrefixdQueued's router queue, when it ran: its threshold,
	// order and aging.
	Queue string `json:"queue,omitempty"`
}

// Knee is one policy's saturation point in a sweep, at one replica count.
type Knee struct {
	Policy   Policy  `json:"policy"`
	Replicas int     `json:"replicas"`
	Speedup  float64 `json:"speedup"` // 0: saturated at every speedup
	PeakRPS  float64 `json:"peak_rps"`
}

// kneeFraction of the offered rate is what a policy must still complete,
// within the arrival window, to be below its knee.
const kneeFraction = 0.9

// NewReport assembles a report of results. Results at more than one
// replica count make a replica sweep: rows are named with their count.
func NewReport(traceName string, requests int, cfg Config, results []Result) Report {
	prefill := 0
	if slices.ContainsFunc(results, func(r Result) bool { return r.Policy == Disagg }) {
		prefill = cfg.prefillEngines()
	}
	rep := Report{Trace: traceName, Requests: requests, Results: results, Fleet: FleetInfo{
		Engines: cfg.Engines, PrefillEngines: prefill, TotalBlocks: cfg.TotalBlocks, BlockSize: cfg.BlockSize,
		EventDelayMS: ms(cfg.EventDelay), PredictedTTLS: cfg.PredictedTTL.Seconds(), ApproxTTLS: cfg.ApproxTTL.Seconds(),
		OverlapWeight: cfg.Options.OverlapCredit, Seed: cfg.Seed, ScrapeIntervalMS: ms(cfg.ScrapeInterval),
		ArrivalJitterMS: ms(cfg.ArrivalJitter)}}
	if slices.ContainsFunc(results, func(r Result) bool { return r.Policy == PrefixdQueued }) {
		aging := cfg.Queue.Aging
		if aging <= 0 {
			aging = coordinator.DefaultQueueAging
		}
		rep.Fleet.Queue = fmt.Sprintf("threshold %g, %v, aging %v", cfg.QueueThreshold, cfg.Queue.Order, aging)
	}
	if cfg.Sync {
		d := ms(cfg.SyncDelay)
		rep.Fleet.SyncDelayMS = &d
		rep.Fleet.PeerSpread = cfg.PeerSpread
	}
	if ns := distinct(results, func(r Result) int { return r.Replicas }); len(ns) > 1 || len(ns) == 1 && ns[0] > 1 {
		slices.Sort(ns)
		rep.Replicas = ns
		rep.Fleet.ReplicaSpreadMS = ms(cfg.ReplicaSpread)
	}
	for _, s := range seriesOf(results) {
		k := Knee{Policy: s.Policy, Replicas: s.Replicas}
		for _, r := range results {
			if r.Policy != s.Policy || r.Replicas != s.Replicas {
				continue
			}
			k.PeakRPS = max(k.PeakRPS, r.ThroughputRPS)
			if r.Failed == 0 && r.ThroughputRPS >= kneeFraction*r.OfferedRPS && r.Speedup > k.Speedup {
				k.Speedup = r.Speedup
			}
		}
		rep.Knees = append(rep.Knees, k)
	}
	return rep
}

// distinct returns the values of key over results, in first-seen order.
func distinct[T comparable](results []Result, key func(Result) T) []T {
	var out []T
	for _, r := range results {
		if v := key(r); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// series is one line of a sweep: a policy at a replica count.
type series struct {
	Policy   Policy
	Replicas int
}

func seriesOf(results []Result) []series {
	return distinct(results, func(r Result) series { return series{r.Policy, r.Replicas} })
}

// name is r's row name in this report.
func (rep Report) name(r Result) string { return r.Name(len(rep.Replicas) > 0) }

// speedupsOf returns the results' speedups, ascending.
func speedupsOf(results []Result) []float64 {
	ss := distinct(results, func(r Result) float64 { return r.Speedup })
	slices.Sort(ss)
	return ss
}

// WriteJSON writes the report as indented JSON.
func (rep Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteTable writes one Markdown table per speedup, the comparison of
// prefixd with the oracle and the other policies, and the knees.
func (rep Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	f := rep.Fleet
	fmt.Fprintf(&b, "Trace %s: %d requests. Fleet: %d engines", rep.Trace, rep.Requests, f.Engines)
	if f.PrefillEngines > 0 {
		fmt.Fprintf(&b, " (%s: %d prefill, %d decode)", Disagg, f.PrefillEngines, f.Engines-f.PrefillEngines)
	}
	fmt.Fprintf(&b, ", %d KV blocks of %d tokens each; events delayed %s; predictions %s; approximate TTL %s; overlap weight %g; seed %d",
		f.TotalBlocks, f.BlockSize, dur(f.EventDelayMS/1e3), dur(f.PredictedTTLS), dur(f.ApproxTTLS), f.OverlapWeight, f.Seed)
	if f.ArrivalJitterMS > 0 {
		fmt.Fprintf(&b, "; arrivals jittered by up to %s", dur(f.ArrivalJitterMS/1e3))
	}
	if f.ScrapeIntervalMS > 0 {
		fmt.Fprintf(&b, "; engine load scraped every %s", dur(f.ScrapeIntervalMS/1e3))
	}
	switch {
	case f.SyncDelayMS == nil:
	case *f.SyncDelayMS == 0:
		b.WriteString("; bookings shared between replicas at once")
	default:
		fmt.Fprintf(&b, "; bookings shared between replicas after %s", dur(*f.SyncDelayMS/1e3))
	}
	if f.SyncDelayMS != nil && f.PeerSpread > 0 {
		fmt.Fprintf(&b, ", each spreading its picks by %g", f.PeerSpread)
	}
	if f.Queue != "" {
		fmt.Fprintf(&b, "; router queue (prefixd-queued): %s", f.Queue)
	}
	b.WriteString(".\n")
	for _, sp := range speedupsOf(rep.Results) {
		var rows []Result
		for _, r := range rep.Results {
			if r.Speedup == sp {
				rows = append(rows, r)
			}
		}
		fmt.Fprintf(&b, "\n×%g (offered %.2f req/s)\n\n", sp, rows[0].OfferedRPS)
		b.WriteString("| policy | hit rate | TTFT p50 | p90 | p99 | E2E p50 | p99 | req/s | out tok/s | imbalance | failed | index events / blocks / entries |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, r := range rows {
			idx := ""
			if r.Index != nil {
				idx = fmt.Sprintf("%s / %s / %s", count(r.Index.Events), count(r.Index.Blocks), count(uint64(r.Index.Entries)))
			}
			fmt.Fprintf(&b, "| %s | %.1f %% | %s | %s | %s | %s | %s | %.2f | %.0f | %.2f | %d | %s |\n", rep.name(r), 100*r.HitRate,
				msStr(r.TTFT.P50), msStr(r.TTFT.P90), msStr(r.TTFT.P99), msStr(r.E2E.P50), msStr(r.E2E.P99),
				r.ThroughputRPS, r.OutputTPS, r.Imbalance, r.Failed, idx)
		}
		if line := rep.compare(rows); line != "" {
			b.WriteString("\n" + line + "\n")
		}
	}
	if len(speedupsOf(rep.Results)) > 1 {
		b.WriteString("\nSaturation (the highest speedup completing ≥ 90 % of the offered rate while requests arrive; peak throughput):\n\n")
		for _, k := range rep.Knees {
			at := "saturated at every speedup"
			if k.Speedup > 0 {
				at = fmt.Sprintf("×%g", k.Speedup)
			}
			fmt.Fprintf(&b, "- %s: %s, peak %.2f req/s\n", rep.name(Result{Policy: k.Policy, Replicas: k.Replicas}), at, k.PeakRPS)
		}
	}
	rep.writeReplicas(&b)
	if len(rep.Weights) > 0 {
		fmt.Fprintf(&b, "\nOverlap weight (the cost function's credit per cached block; prefixd serves %g, Dynamo's default is 1):\n\n", float64(coordinator.DefaultOverlapWeight))
		b.WriteString("| policy | weight | load | hit rate | TTFT p50 | p99 | E2E p50 | imbalance |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rep.Weights {
			fmt.Fprintf(&b, "| %s | %g | ×%g | %.1f %% | %s | %s | %s | %.2f |\n", r.Policy, r.Weight, r.Speedup, 100*r.HitRate,
				msStr(r.TTFT.P50), msStr(r.TTFT.P99), msStr(r.E2E.P50), r.Imbalance)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// compare says where prefixd (at the fewest replicas) stands against the
// oracle and the others.
func (rep Report) compare(rows []Result) string {
	i := slices.IndexFunc(rows, func(r Result) bool { return r.Policy == Prefixd })
	if i < 0 {
		return ""
	}
	px := rows[i]
	var parts []string
	for j, r := range rows {
		if j == i || r.HitRate == 0 && r.TTFT.P50 == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: hit %+.1f pt, TTFT p50 %s, p99 %s", rep.name(r),
			100*(px.HitRate-r.HitRate), ratio(px.TTFT.P50, r.TTFT.P50), ratio(px.TTFT.P99, r.TTFT.P99)))
	}
	return rep.name(px) + " against " + strings.Join(parts, "; ") + "."
}

// writeReplicas writes a replica sweep's summary: for each policy run at
// more than one count, hit rate, TTFT and imbalance per load and count,
// against the fewest replicas.
func (rep Report) writeReplicas(b *strings.Builder) {
	if len(rep.Replicas) == 0 {
		return
	}
	fmt.Fprintf(b, "\nReplicas (requests spread round-robin over N routers, each with its own bookings and index; events reach replicas after %s plus up to %s):\n\n",
		dur(rep.Fleet.EventDelayMS/1e3), dur(rep.Fleet.ReplicaSpreadMS/1e3))
	b.WriteString("| policy | load | N | hit rate | Δ hit | TTFT p50 | × | p99 | × | imbalance |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range distinct(rep.Results, func(r Result) Policy { return r.Policy }) {
		for _, sp := range speedupsOf(rep.Results) {
			var rows []Result
			for _, r := range rep.Results {
				if r.Policy == p && r.Speedup == sp {
					rows = append(rows, r)
				}
			}
			if len(rows) < 2 {
				continue
			}
			base := rows[0]
			for _, r := range rows {
				fmt.Fprintf(b, "| %s | ×%g | %d | %.1f %% | %+.1f pt | %s | %s | %s | %s | %.2f |\n", p, sp, r.Replicas, 100*r.HitRate,
					100*(r.HitRate-base.HitRate), msStr(r.TTFT.P50), ratio(r.TTFT.P50, base.TTFT.P50), msStr(r.TTFT.P99),
					ratio(r.TTFT.P99, base.TTFT.P99), r.Imbalance)
			}
		}
	}
}

// ratio is a/b as "0.93×".
func ratio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func msStr(v float64) string {
	switch {
	case v >= 10_000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func dur(sec float64) string {
	if sec == 0 {
		return "off"
	}
	return time.Duration(sec * float64(time.Second)).String()
}

func count(n uint64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
