package demo

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

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
	fmt.Fprintf(&b, "\nRouting the same %d-request chat workload three ways, %d clients at a time (simulated TTFT = uncached prompt tokens × prefill cost):\n\n", r.requests(), max(r.Concurrency, 1))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "routing\tcache hit rate\tTTFT p50\tTTFT p99\trequests per worker\t")
	for _, m := range r.Modes {
		ids := make([]uint64, 0, len(m.PerWorker))
		for id := range m.PerWorker {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		var per []string
		for _, id := range ids {
			per = append(per, fmt.Sprintf("%d:%d", id, m.PerWorker[id]))
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%v\t%v\t%s\t\n", m.Name, 100*m.HitRate(), m.Percentile(0.5), m.Percentile(0.99), strings.Join(per, " "))
	}
	tw.Flush()
	for _, m := range r.Modes {
		if m.Bypass+m.Remote > 0 {
			fmt.Fprintf(&b, "\ndecode-first plans: %d bypass (prefill on the decode worker), %d remote prefill; %.0f compensations\n",
				m.Bypass, m.Remote, r.Compensations)
		}
	}
	secs := r.Elapsed.Seconds()
	fmt.Fprintf(&b, "\nevent streams: %d engines published %d batches (%d dropped on purpose); prefixd applied %.0f events (%.0f/s over the run),\n",
		r.Engines, r.Batches, r.LiveDropped, r.EventsApplied, r.EventsApplied/secs)
	fmt.Fprintf(&b, "  detected %.0f gaps, ran %.0f replays, saw %.0f engine restarts\n", r.Gaps, r.Replays, r.Restarts)
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

func (r *Report) requests() int {
	if len(r.Modes) == 0 {
		return 0
	}
	return r.Modes[0].Requests
}
