package status

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one series of a metric: its labels and value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Metrics are the counter, gauge and untyped series of a /metrics page,
// by metric name. Histograms and summaries are left out. The zero value
// (nil) has no series.
type Metrics map[string][]Sample

// ParseMetrics reads a page in the Prometheus text format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	m := make(Metrics, len(fams))
	for name, f := range fams {
		for _, s := range f.GetMetric() {
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = s.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = s.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				v = s.GetUntyped().GetValue()
			default:
				continue
			}
			labels := make(map[string]string, len(s.GetLabel()))
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			m[name] = append(m[name], Sample{Labels: labels, Value: v})
		}
	}
	return m, nil
}

// matches reports whether labels hold every (name, value) pair of match.
func matches(labels map[string]string, match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		if labels[match[i]] != match[i+1] {
			return false
		}
	}
	return true
}

// Get returns the value of the first series of name whose labels include
// the (name, value) pairs of match; ok is false if there is none.
func (m Metrics) Get(name string, match ...string) (v float64, ok bool) {
	for _, s := range m[name] {
		if matches(s.Labels, match) {
			return s.Value, true
		}
	}
	return 0, false
}

// Sum adds the values of name's series whose labels include the
// (name, value) pairs of match.
func (m Metrics) Sum(name string, match ...string) float64 {
	var sum float64
	for _, s := range m[name] {
		if matches(s.Labels, match) {
			sum += s.Value
		}
	}
	return sum
}

// By sums name's series that include the pairs of match, grouped by the
// value of label. The caller owns the map.
func (m Metrics) By(name, label string, match ...string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m[name] {
		if matches(s.Labels, match) {
			out[s.Labels[label]] += s.Value
		}
	}
	return out
}
