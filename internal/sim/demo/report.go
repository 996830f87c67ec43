package demo

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prefixd/prefixd/catalog"
	dto "github.com/prometheus/client_model/go"
)

// sumMetric adds up every series of the named counter or gauge.
func sumMetric(mf []*dto.MetricFamily, name string) float64 {
	var sum float64
	for _, f := range mf {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Write prints the report.
func (r *Report) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nThe same %d-request chat workload as OpenAI requests, %d clients at a time: through prefixd proxy three ways,\n", r.requests(), max(r.Concurrency, 1))
	fmt.Fprintf(&b, "and through a gateway that asks prefixd's endpoint picker over ext_proc\n")
	fmt.Fprintf(&b, "(TTFT and end-to-end latency measured at the client; engines modelled on Llama-3.1-8B on an H100 at %g× speed):\n\n", 1/r.TimeScale)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "routing\tcache hit rate\tTTFT p50\tTTFT p99\te2e p50\te2e p99\treq/s\trequests per worker (p: prefill, d: decode)\t")
	for _, m := range r.Modes {
		ids := make([]uint64, 0, len(m.PerWorker))
		for id := range m.PerWorker {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		var per []string
		for _, id := range ids {
			tag := ""
			switch m.Roles[id] {
			case catalog.RolePrefill:
				tag = "p"
			case catalog.RoleDecode:
				tag = "d"
			}
			per = append(per, fmt.Sprintf("%d%s:%d", id, tag, m.PerWorker[id]))
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%v\t%v\t%v\t%v\t%.0f\t%s\t\n", m.Name, 100*m.HitRate(), round(m.Percentile(0.5)), round(m.Percentile(0.99)),
			round(m.E2EPercentile(0.5)), round(m.E2EPercentile(0.99)), m.Throughput(), strings.Join(per, " "))
	}
	tw.Flush()
	for _, c := range r.Claims() {
		fmt.Fprintf(&b, "\n%s", c)
	}
	if len(r.Modes) > 0 {
		fmt.Fprintf(&b, "\nThe latency columns are this run's and move from run to run, p99 the most (it is the %s slowest of %d\n"+
			"requests): compare them over several runs (--seed) before drawing a conclusion.\n", ordinal(p99Rank(r.requests())), r.requests())
	}
	for _, m := range r.Modes {
		if m.Bypass+m.Remote > 0 {
			fmt.Fprintf(&b, "\ndecode-first plans: %d bypass (prefill on the decode worker), %d remote prefill; %.0f compensations\n",
				m.Bypass, m.Remote, r.Compensations)
		}
	}
	secs := r.Elapsed.Seconds()
	fmt.Fprintf(&b, "\nevent streams: %d engines published %d batches (%d dropped on purpose); prefixd applied %.0f events (%.0f/s over the run),\n",
		r.Engines, r.Batches, r.LiveDropped, r.EventsApplied, r.EventsApplied/secs)
	fmt.Fprintf(&b, "  saw %.0f gaps (a live batch arriving after dropped ones), ran %.0f replays to fetch missed batches (one per\n"+
		"  stream at join, then after gaps) and %.0f idle probes (a quiet stream asking for anything newer), saw %.0f engine restarts\n",
		r.Gaps, r.Replays, r.Probes, r.Restarts)
	fmt.Fprintf(&b, "index: %d (block, worker) entries, about %.1f KiB\n", r.IndexEntries, float64(r.IndexBytes)/1024)
	if len(r.Mismatches) == 0 {
		fmt.Fprintf(&b, "check: the index matches every engine's cache exactly (%d engines)\n", r.Engines)
	} else {
		fmt.Fprintf(&b, "check FAILED: %d differences between the index and the engines' caches:\n", len(r.Mismatches))
		for _, d := range r.Mismatches[:min(len(r.Mismatches), 20)] {
			fmt.Fprintf(&b, "  %s\n", d)
		}
	}
	fmt.Fprintf(&b, "done in %.1f s\n", secs)
	_, err := io.WriteString(w, b.String())
	return err
}

// Claims are what the run shows that holds in every run: how much of the
// prompt KV-aware routing (through the proxy and through the gateway)
// took from the engines' prefix caches, against random routing. Each is
// worded from the numbers, so it is true of this run whatever they are;
// TestDemoClaimsHoldEveryRun checks that they say "fewer" run after run.
func (r *Report) Claims() []string {
	random, ok := r.mode("random")
	if !ok {
		return nil
	}
	var out []string
	for _, name := range []string{"prefixd (KV-aware)", gatewayMode} {
		m, ok := r.mode(name)
		if !ok || random.PromptTokens == 0 {
			continue
		}
		computed, base := m.PromptTokens-m.CachedTokens, random.PromptTokens-random.CachedTokens
		verb, diff := "fewer", base-computed
		if diff < 0 {
			verb, diff = "more", -diff
		}
		out = append(out, fmt.Sprintf("%s: %.1f%% of prompt tokens from the prefix cache against random's %.1f%%; the engines computed %d %s prompt tokens (%.0f%%).",
			m.Name, 100*m.HitRate(), 100*random.HitRate(), diff, verb, 100*float64(diff)/float64(max(base, 1))))
	}
	return out
}

// mode returns the result of the mode named name.
func (r *Report) mode(name string) (ModeResult, bool) {
	for _, m := range r.Modes {
		if m.Name == name {
			return m, true
		}
	}
	return ModeResult{}, false
}

// p99Rank is which slowest of n samples the nearest-rank p99 is (1:
// the slowest), as quantile.At picks it.
func p99Rank(n int) int {
	return n - int(math.Ceil(0.99*float64(n)*(1-1e-12))) + 1
}

// ordinal renders n as "6th".
func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

func (r *Report) requests() int {
	if len(r.Modes) == 0 {
		return 0
	}
	return r.Modes[0].Requests
}

// round keeps a duration readable: 3 significant digits at most.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}
