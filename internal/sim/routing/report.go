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
	OverlapWeight  float64 `json:"overlap_weight"`
	Seed           uint64  `json:"seed"`
}

// Knee is one policy's saturation point in a sweep.
type Knee struct {
	Policy  Policy  `json:"policy"`
	Speedup float64 `json:"speedup"` // 0: saturated at every speedup
	PeakRPS float64 `json:"peak_rps"`
}

// kneeFraction of the offered rate is what a policy must still complete,
// within the arrival window, to be below its knee.
const kneeFraction = 0.9

// NewReport assembles a report of results.
func NewReport(traceName string, requests int, cfg Config, results []Result) Report {
	prefill := 0
	if slices.ContainsFunc(results, func(r Result) bool { return r.Policy == Disagg }) {
		prefill = cfg.prefillEngines()
	}
	rep := Report{Trace: traceName, Requests: requests, Results: results, Fleet: FleetInfo{
		Engines: cfg.Engines, PrefillEngines: prefill, TotalBlocks: cfg.TotalBlocks, BlockSize: cfg.BlockSize,
		EventDelayMS: ms(cfg.EventDelay), PredictedTTLS: cfg.PredictedTTL.Seconds(), ApproxTTLS: cfg.ApproxTTL.Seconds(),
		OverlapWeight: cfg.Options.OverlapCredit, Seed: cfg.Seed}}
	for _, p := range policiesOf(results) {
		k := Knee{Policy: p}
		for _, r := range results {
			if r.Policy != p {
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

func policiesOf(results []Result) []Policy {
	return distinct(results, func(r Result) Policy { return r.Policy })
}

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
	fmt.Fprintf(&b, ", %d KV blocks of %d tokens each; events delayed %s; predictions %s; approximate TTL %s; overlap weight %g; seed %d.\n",
		f.TotalBlocks, f.BlockSize, dur(f.EventDelayMS/1e3), dur(f.PredictedTTLS), dur(f.ApproxTTLS), f.OverlapWeight, f.Seed)
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
			fmt.Fprintf(&b, "| %s | %.1f %% | %s | %s | %s | %s | %s | %.2f | %.0f | %.2f | %d | %s |\n", r.Policy, 100*r.HitRate,
				msStr(r.TTFT.P50), msStr(r.TTFT.P90), msStr(r.TTFT.P99), msStr(r.E2E.P50), msStr(r.E2E.P99),
				r.ThroughputRPS, r.OutputTPS, r.Imbalance, r.Failed, idx)
		}
		if line := compare(rows); line != "" {
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
			fmt.Fprintf(&b, "- %s: %s, peak %.2f req/s\n", k.Policy, at, k.PeakRPS)
		}
	}
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

// compare says where prefixd stands against the oracle and the others.
func compare(rows []Result) string {
	i := slices.IndexFunc(rows, func(r Result) bool { return r.Policy == Prefixd })
	if i < 0 {
		return ""
	}
	px := rows[i]
	var parts []string
	for _, r := range rows {
		if r.Policy == Prefixd || r.HitRate == 0 && r.TTFT.P50 == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: hit %+.1f pt, TTFT p50 %s, p99 %s", r.Policy,
			100*(px.HitRate-r.HitRate), ratio(px.TTFT.P50, r.TTFT.P50), ratio(px.TTFT.P99, r.TTFT.P99)))
	}
	return "prefixd against " + strings.Join(parts, "; ") + "."
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
